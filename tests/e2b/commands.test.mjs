// envd's process service through sbx's E2B front, driven by the unmodified `e2b` SDK
// against a real sbx-server with the local runtime: commands.run in the foreground with
// onStdout / onStderr and exit codes, the create's envs reaching the command, in the
// background then connect, sendStdin, kill, list. Then the envd access token as a trust
// boundary: another sandbox's token, a forged one and one moved to another tenant are
// all refused.
import assert from 'node:assert/strict';
import {after, before, test} from 'node:test';

import {AuthenticationError, CommandExitError, Sandbox} from 'e2b';

import {BOB, TestServer} from './harness.mjs';

const server = new TestServer();
let sbx;

before(async () => {
  await server.start();
  server.useFromE2b();
  sbx = await Sandbox.create('default', {timeoutMs: 300_000, envs: {FOO: 'bar baz'}});
});

after(async () => {
  if (sbx) await sbx.kill().catch(() => {});
  await server.cleanUp();
});

test('run in the foreground: output, callbacks, exit codes, envs', async () => {
  const ok = await sbx.commands.run('echo "$FOO"; echo "$LOCAL"', {envs: {LOCAL: 'x1'}});
  assert.equal(ok.exitCode, 0);
  assert.equal(ok.stdout, 'bar baz\nx1\n');
  assert.equal(ok.stderr, '');

  const out = [];
  const err = [];
  await assert.rejects(
      sbx.commands.run('echo to-out; echo to-err >&2; exit 3',
                       {onStdout: (d) => out.push(d), onStderr: (d) => err.push(d)}),
      (e) => {
        assert.ok(e instanceof CommandExitError, `${e}`);
        assert.equal(e.exitCode, 3);
        assert.equal(e.stdout, 'to-out\n');
        assert.equal(e.stderr, 'to-err\n');
        return true;
      });
  assert.equal(out.join(''), 'to-out\n');
  assert.equal(err.join(''), 'to-err\n');

  // Output larger than one chunk, in order.
  const big = await sbx.commands.run('seq 1 20000');
  assert.equal(big.stdout, Array.from({length: 20000}, (_, i) => `${i + 1}\n`).join(''));

  // E2B's home, /home/user, is the sandbox's workspace ($HOME).
  await sbx.commands.run('mkdir -p sub/dir');
  const cwd = await sbx.commands.run('pwd; test "$PWD" = "$HOME/sub/dir"', {cwd: '/home/user/sub/dir'});
  assert.match(cwd.stdout, /\/sub\/dir\n$/);
  // Other absolute paths are the sandbox's own (its root as its processes see it).
  const etc = await sbx.commands.run('pwd', {cwd: '/tmp'});
  assert.equal(etc.stdout, '/tmp\n');
});

test('background, list, sendStdin, connect, kill', async () => {
  const reader = await sbx.commands.run('read line; echo "got $line"', {background: true, stdin: true});
  const listed = await sbx.commands.list();
  const entry = listed.find((p) => p.pid === reader.pid);
  assert.ok(entry, `pid ${reader.pid} in ${JSON.stringify(listed)}`);
  assert.equal(entry.cmd, '/bin/bash');
  assert.deepEqual(entry.args, ['-l', '-c', 'read line; echo "got $line"']);
  await sbx.commands.sendStdin(reader.pid, 'hello\n');
  const done = await reader.wait();
  assert.equal(done.exitCode, 0);
  assert.equal(done.stdout, 'got hello\n');

  // Leave a process, then connect to it again by pid.
  const ticker = await sbx.commands.run('sleep 0.5; echo tick1; sleep 0.5; echo tick2',
                                        {background: true});
  await ticker.disconnect();
  const seen = [];
  const again = await sbx.commands.connect(ticker.pid, {onStdout: (d) => seen.push(d)});
  const result = await again.wait();
  assert.equal(result.exitCode, 0);
  assert.match(seen.join(''), /tick2\n$/);

  const sleeper = await sbx.commands.run('sleep 600', {background: true});
  assert.equal(await sbx.commands.kill(sleeper.pid), true);
  await assert.rejects(sleeper.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, `${e}`);
    assert.notEqual(e.exitCode, 0);
    return true;
  });
  assert.equal(await sbx.commands.kill(999999), false, 'no such process: false');
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === sleeper.pid));
});

// Raw Connect calls to envd with chosen headers.
async function envdList(sandboxId, token) {
  const headers = {'Content-Type': 'application/json', 'E2b-Sandbox-Id': sandboxId,
                   'E2b-Sandbox-Port': '49983'};
  if (token !== undefined) headers['X-Access-Token'] = token;
  const res = await fetch(`${server.url}/process.Process/List`, {method: 'POST', headers, body: '{}'});
  return {status: res.status, body: await res.json()};
}

test("envd refuses a missing, forged or other sandbox's access token", async () => {
  const mine = await envdList(sbx.sandboxId, sbx.envdAccessToken);
  assert.equal(mine.status, 200, JSON.stringify(mine.body));

  const bobs = await Sandbox.create('default', {apiKey: BOB, timeoutMs: 60_000});
  try {
    const attempts = {
      'none': undefined,
      'empty': '',
      "bob's own sandbox's token": bobs.envdAccessToken,
      'alice tenant, bob hmac': `alice~${bobs.envdAccessToken.split('~')[1]}`,
      'bob tenant, alice hmac': `bob~${sbx.envdAccessToken.split('~')[1]}`,
      'forged': `alice~${'0'.repeat(64)}`,
      'truncated': sbx.envdAccessToken.slice(0, -1),
    };
    for (const [what, token] of Object.entries(attempts)) {
      const res = await envdList(sbx.sandboxId, token);
      assert.equal(res.status, 401, `${what}: ${JSON.stringify(res.body)}`);
      assert.equal(res.body.code, 'unauthenticated', what);
    }
    // Through the SDK: alice's sandbox id with bob's sandbox's access token.
    const forged = new Sandbox({sandboxId: sbx.sandboxId, envdAccessToken: bobs.envdAccessToken,
                                envdVersion: '0.5.7', apiKey: BOB});
    await assert.rejects(forged.commands.run('id'), AuthenticationError);
  } finally {
    await bobs.kill();
  }
});

test('bad Connect requests are answered with Connect errors', async () => {
  const headers = {'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken};
  const post = (path, type, body) => fetch(`${server.url}${path}`, {
    method: 'POST', headers: {...headers, 'Content-Type': type}, body});
  let res = await post('/process.Process/List', 'application/json', '{"nope": ');
  assert.equal(res.status, 400);
  assert.equal((await res.json()).code, 'invalid_argument');
  res = await post('/process.Process/List', 'application/proto', '');
  assert.equal(res.status, 415);
  res = await post('/process.Process/SendSignal', 'application/json', '{"signal": "SIGNAL_SIGKILL"}');
  assert.equal(res.status, 400);
  assert.match((await res.json()).message, /names no process/);
  res = await post('/process.Process/Nothing', 'application/json', '{}');
  assert.equal(res.status, 501);
  assert.equal((await res.json()).code, 'unimplemented');
  // A stream whose envelope lies about its length ends with an error end-stream message.
  const bad = Buffer.concat([Buffer.from([0, 0, 0, 0, 99]), Buffer.from('{}')]);
  res = await post('/process.Process/Start', 'application/connect+json', bad);
  assert.equal(res.status, 200);
  const body = Buffer.from(await res.arrayBuffer());
  assert.equal(body[0], 2, 'an end-stream envelope');
  const end = JSON.parse(body.subarray(5).toString());
  assert.equal(end.error.code, 'invalid_argument');
  assert.match(end.error.message, /envelope says 99 bytes/);
});
