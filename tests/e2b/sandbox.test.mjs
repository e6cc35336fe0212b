// The rest of a sandbox's life through sbx's E2B front, with the unmodified `e2b` SDK
// against a real local sbx-server: a PTY (create, sendInput, resize, its output), watchDir
// (events for files made, written and removed), and a second client that connects to the
// same sandbox by id and works in it.
import assert from 'node:assert/strict';
import {after, before, test} from 'node:test';
import {setTimeout as sleep} from 'node:timers/promises';

import {Sandbox} from 'e2b';

import {TestServer} from './harness.mjs';

const server = new TestServer();
let sbx;

before(async () => {
  await server.start();
  server.useFromE2b();
  sbx = await Sandbox.create('default', {timeoutMs: 300_000});
});

after(async () => {
  if (sbx) await sbx.kill().catch(() => {});
  await server.cleanUp();
});

async function until(what, cond, ms = 20_000) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

test('pty: create, sendInput, resize, output', async () => {
  let output = '';
  const decoder = new TextDecoder();
  const pty = await sbx.pty.create({cols: 80, rows: 24, onData: (d) => { output += decoder.decode(d); }});
  assert.ok(pty.pid > 0);
  const enc = new TextEncoder();
  await sbx.pty.sendInput(pty.pid, enc.encode('stty size; echo "tty=$(test -t 0 && echo yes)"\n'));
  await until('the first size', () => /24 80/.test(output) && /tty=yes/.test(output));
  await sbx.pty.resize(pty.pid, {cols: 100, rows: 30});
  await sbx.pty.sendInput(pty.pid, enc.encode('stty size\n'));
  await until('the new size', () => /30 100/.test(output));
  await sbx.pty.sendInput(pty.pid, enc.encode('exit 7\n'));
  const result = await pty.wait().catch((e) => e);
  assert.equal(result.exitCode, 7);
});

test('watchDir reports files made, written and removed', async () => {
  await sbx.files.makeDir('/home/user/watched');
  const events = [];
  const handle = await sbx.files.watchDir('/home/user/watched', (ev) => events.push(ev));
  try {
    await sbx.files.write('/home/user/watched/new.txt', 'x');
    await until('a create of new.txt', () => events.some((e) => e.name === 'new.txt' && e.type === 'create'));
    await sbx.commands.run('echo more >> watched/new.txt');
    await until('a write of new.txt', () => events.some((e) => e.name === 'new.txt' && e.type === 'write'));
    await sbx.files.remove('/home/user/watched/new.txt');
    await until('a remove of new.txt', () => events.some((e) => e.name === 'new.txt' && e.type === 'remove'));
  } finally {
    await handle.stop();
  }
  await assert.rejects(sbx.files.watchDir('/home/user/not-there', () => {}), /not found|not_found|NotFound/i);
});

test('a second client connects to the sandbox by id', async () => {
  await sbx.files.write('/home/user/shared.txt', 'from the first client');
  const other = await Sandbox.connect(sbx.sandboxId);
  assert.equal(other.sandboxId, sbx.sandboxId);
  assert.equal(await other.files.read('/home/user/shared.txt'), 'from the first client');
  const run = await other.commands.run('cat shared.txt; echo; echo second >> shared.txt');
  assert.equal(run.stdout, 'from the first client\n');
  assert.equal(await sbx.files.read('/home/user/shared.txt'), 'from the first clientsecond\n');
  assert.equal((await other.getInfo()).state, 'running');
});

test('the server stops promptly and cleanly with an E2B process stream open', async (t) => {
  const own = new TestServer();
  await own.start();
  const opts = {apiKey: process.env.E2B_API_KEY, apiUrl: own.url, sandboxUrl: own.url};
  // The SDK reads the URLs from the environment at each call: point it at this server.
  const saved = {api: process.env.E2B_API_URL, sandbox: process.env.E2B_SANDBOX_URL};
  process.env.E2B_API_URL = own.url;
  process.env.E2B_SANDBOX_URL = own.url;
  try {
    const s = await Sandbox.create('default', {...opts, timeoutMs: 60_000});
    const h = await s.commands.run('sleep 100', {background: true});
    const t0 = Date.now();
    await own.stop();
    t.diagnostic(`stopped in ${Date.now() - t0} ms`);
    assert.equal(own.proc.exitCode, 0, own.log);
    await h.wait().catch(() => {});
  } finally {
    process.env.E2B_API_URL = saved.api;
    process.env.E2B_SANDBOX_URL = saved.sandbox;
    await own.cleanUp();
  }
});
