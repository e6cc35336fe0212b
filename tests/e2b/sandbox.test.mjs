// The rest of a sandbox's life through sbx's E2B front, with the unmodified `e2b` SDK
// against a real local sbx-server: a PTY (create, sendInput, resize, its output), watchDir
// (events for files made, written and removed), and a second client that connects to the
// same sandbox by id and works in it.
import assert from 'node:assert/strict';
import http from 'node:http';
import {after, before, test} from 'node:test';
import {setTimeout as sleep} from 'node:timers/promises';

import {Sandbox} from 'e2b';

import {BOB, TestServer} from './harness.mjs';

// With the port proxy, and the E2B domain the SDK's getHost names (E2B_DOMAIN, harness.mjs).
const server = new TestServer({extraArgs: ['--proxy_listen=127.0.0.1:0', '--e2b_domain=sbx.localhost']});
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

// A GET to the E2B listener with chosen headers (Host included, which fetch cannot set).
function rawGet(path, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request({host: '127.0.0.1', port: server.e2bPort, path, headers}, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({status: res.statusCode, headers: res.headers, body}));
    });
    req.on('error', reject);
    req.end();
  });
}

test('ports: by the sandbox headers and by getHost, through the port proxy', async () => {
  await sbx.files.write('/home/user/site/hello.txt', 'hello through the proxy\n');
  const web = await sbx.commands.run('cd site && exec python3 -m http.server 8000 --bind 127.0.0.1',
                                     {background: true});
  try {
    const headers = {'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000',
                     'X-Access-Token': sbx.envdAccessToken};
    // fetch follows the 307 to the port proxy (a URL token for this sandbox and port).
    let text;
    const deadline = Date.now() + 20_000;
    while (text === undefined) {
      const res = await fetch(`${server.url}/hello.txt`, {headers});
      if (res.status === 200) {
        text = await res.text();
      } else {
        await res.arrayBuffer();
        if (Date.now() > deadline) throw new Error(`the web server never answered: ${res.status}`);
        await sleep(100);
      }
    }
    assert.equal(text, 'hello through the proxy\n');

    // The host form: PORT-ID.DOMAIN as getHost names it.
    const host = sbx.getHost(8000);
    const byHost = await rawGet('/hello.txt?x=1', {'Host': host, 'X-Access-Token': sbx.envdAccessToken});
    assert.equal(byHost.status, 307, byHost.body);
    const location = new URL(byHost.headers.location);
    assert.equal(location.pathname, `/_sbx/${sbx.sandboxId}/8000/hello.txt`);
    assert.equal(location.searchParams.get('x'), '1');
    assert.ok(location.searchParams.get('sbx_token'));
    const followed = await fetch(location);
    assert.equal(await followed.text(), 'hello through the proxy\n');

    // No token, or another sandbox's: refused, and no URL given out.
    const bobs = await Sandbox.create('default', {apiKey: BOB, timeoutMs: 60_000});
    try {
      for (const token of [undefined, bobs.envdAccessToken]) {
        const h = {'Host': host};
        if (token) h['X-Access-Token'] = token;
        const res = await rawGet('/hello.txt', h);
        assert.equal(res.status, 401, `${token}: ${res.body}`);
        assert.equal(res.headers.location, undefined);
      }
    } finally {
      await bobs.kill();
    }
  } finally {
    await sbx.commands.kill(web.pid);
  }
});
