// The SDK against a real sbx-server with real sandboxes (local runtime, the pool
// "default" of scripts/example-config.yaml): exec, streams, files, renew, suspend,
// release on exceptions, batches, watch, abort, and the quickstart example.
import assert from 'node:assert/strict';
import {execFile} from 'node:child_process';
import path from 'node:path';
import {after, before, describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';
import {promisify} from 'node:util';

import {Cancelled, Client, FailedPrecondition, InvalidArgument, NotFound, Sandbox, type ClaimEvent} from '@sbx/client';

import {TestServer, waitFor} from './harness.js';

const kPool = 'default';
let server: TestServer;
let client: Client;

async function stateOf(claimId: string): Promise<string> {
  return (await client.getClaim(claimId)).state;
}

before(async () => {
  server = new TestServer({runtime: 'local'});
  await server.start();
  client = new Client({server: server.target});
});

after(async () => {
  client?.close();
  await server?.cleanUp();
});

describe('exec', () => {
  it('runs shell strings and argv, with the claim env, exec env, cwd, stdin and exit codes', async () => {
    await using sb = await client.claim(kPool, {ttl: '10m', wait: '60s', env: {SEED: '7'},
                                                files: {'in/a.txt': 'hello'}, labels: {test: 'exec'}});
    assert.equal(sb.claim?.state, 'active');
    assert.equal(sb.claim?.labels.test, 'exec');
    assert.equal(sb.replayed, false);

    const r = await sb.exec('echo out $SEED $EXTRA; cat a.txt; echo err >&2; exit 3', {env: {EXTRA: 'x'}, cwd: 'in'});
    assert.equal(r.stdout, 'out 7 x\nhello');
    assert.equal(r.stderr, 'err\n');
    assert.equal(r.exitCode, 3);
    assert.equal(r.signal, null);
    assert.equal(r.timedOut, false);
    assert.ok(r.pid > 0);

    const cat = await sb.exec(['cat'], {stdin: 'piped\ninput'});
    assert.equal(cat.stdout, 'piped\ninput');
    assert.equal(cat.exitCode, 0);

    const slow = await sb.exec(['sleep', '30'], {timeout: '300ms'});
    assert.equal(slow.timedOut, true);
    assert.equal(slow.signal, 9);
    assert.equal(slow.exitCode, null);

    const big = await sb.exec(['head', '-c', '100000', '/dev/zero'], {maxOutputBytes: 1000});
    assert.equal(big.truncated, true);
    assert.equal(big.stdoutBuffer.length, 1000);
    assert.equal(big.stdoutBytes, 100000);

    await assert.rejects(sb.exec(['/no/such/program']), FailedPrecondition);
  });

  it('streams output, takes stdin writes and signals', async () => {
    await using sb = await client.claim(kPool, {wait: '60s'});
    const p = sb.execStream(['sh', '-c', 'trap "echo bye; exit 5" TERM; echo ready; while read l; do echo "got $l"; echo "e $l" >&2; done'],
                            {stdin: true});
    assert.ok((await p.started).pid > 0);
    const seen: string[] = [];
    for await (const chunk of p) {
      seen.push(`${chunk.stream}:${chunk.data.toString()}`);
      const text = seen.join('');
      if (text.includes('ready') && !text.includes('got one')) await p.write('one\n');
      if (text.includes('e one') && !text.includes('bye')) await p.kill('SIGTERM');
    }
    const exit = await p.exit;
    const all = seen.join('');
    assert.match(all, /stdout:got one/);
    assert.match(all, /stderr:e one/);
    assert.match(all, /bye/);
    assert.equal(exit.exitCode, 5);
  });

  it('closeStdin ends the input; wait() drains and returns the exit', async () => {
    await using sb = await client.claim(kPool, {wait: '60s'});
    const p = sb.execStream(['wc', '-c'], {stdin: true});
    await p.write('12345');
    await p.closeStdin();
    const exit = await p.wait();
    assert.equal(exit.exitCode, 0);
    assert.equal(exit.stdoutBytes, 2);  // "5\n"
    await assert.rejects(p.kill(), FailedPrecondition);  // it has ended
  });

  it('an AbortSignal cancels a running command', async () => {
    await using sb = await client.claim(kPool, {wait: '60s'});
    const ac = new AbortController();
    const p = sb.exec(['sleep', '60'], {signal: ac.signal});
    // Abort once the process runs: its pid shows in ps.
    await waitForProcess(sb, 'sleep 60');
    ac.abort(new Error('stop it'));
    const err = await p.then(() => null, (e: unknown) => e);
    assert.ok(err instanceof Cancelled, `got ${err}`);
    assert.equal((err as Cancelled).code, 'CANCELLED');
    assert.equal(((err as Cancelled).cause as Error).message, 'stop it');
    // The call's cancellation killed the process.
    await waitForNoProcess(sb, 'sleep 60');
    // An already aborted signal fails before any call.
    await assert.rejects(sb.exec('true', {signal: AbortSignal.abort()}), Cancelled);
  });
});

async function psHas(sb: Sandbox, text: string): Promise<boolean> {
  const r = await sb.exec(['sh', '-c', 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < $f; echo; done']);
  return r.stdout.split('\n').some((l) => l.trim() === text);
}

async function waitForProcess(sb: Sandbox, text: string): Promise<void> {
  for (let i = 0; i < 500 && !(await psHas(sb, text)); i++) await new Promise((r) => setTimeout(r, 20));
  assert.ok(await psHas(sb, text), `no process "${text}"`);
}

async function waitForNoProcess(sb: Sandbox, text: string): Promise<void> {
  for (let i = 0; i < 500 && (await psHas(sb, text)); i++) await new Promise((r) => setTimeout(r, 20));
  assert.ok(!(await psHas(sb, text)), `process "${text}" still runs`);
}

describe('files', () => {
  it('write, read, list, exists, remove', async () => {
    await using sb = await client.claim(kPool, {wait: '60s'});
    const big = Buffer.alloc(2 * 1024 * 1024 + 17);
    for (let i = 0; i < big.length; i++) big[i] = (i * 7) & 0xff;
    assert.equal(await sb.files.write('dir/sub/big.bin', big), big.length);
    assert.ok((await sb.files.read('dir/sub/big.bin')).equals(big));
    assert.equal(await sb.files.write('run.sh', '#!/bin/sh\necho ran\n', {mode: 0o755}), 19);
    assert.equal(await sb.files.write('run.sh', 'echo more\n', {append: true}), 29);
    assert.equal(await sb.files.readText('run.sh'), '#!/bin/sh\necho ran\necho more\n');
    assert.equal((await sb.exec(['./run.sh'])).stdout, 'ran\nmore\n');
    await assert.rejects(sb.files.write('nodir/x', 'x', {createParents: false}), NotFound);

    const top = await sb.files.list();
    assert.deepEqual(top.map((f) => [f.path, f.type]), [['dir', 'directory'], ['run.sh', 'file']]);
    assert.equal(top[1]!.mode & 0o777, 0o755);
    const all = await sb.files.list('dir', {recursive: true});
    assert.deepEqual(all.map((f) => f.path), ['dir/sub', 'dir/sub/big.bin']);
    assert.equal(all[1]!.size, big.length);

    assert.equal(await sb.files.exists('run.sh'), true);
    assert.equal(await sb.files.exists('dir'), true);
    assert.equal(await sb.files.exists('missing'), false);
    assert.equal(await sb.files.exists('dir/missing/x'), false);
    await assert.rejects(sb.files.read('missing'), NotFound);

    await sb.files.remove('run.sh');
    assert.equal(await sb.files.exists('run.sh'), false);
    await sb.files.remove('run.sh');  // missing: not an error
    await assert.rejects(sb.files.remove('dir'), FailedPrecondition);  // a directory without recursive
    await sb.files.remove('dir', {recursive: true});
    assert.deepEqual(await sb.files.list(), []);
    await assert.rejects(sb.files.remove('../etc'), InvalidArgument);
  });

  it('exists() of another claim is NotFound, not false', async () => {
    await assert.rejects(client.sandbox('no-such-claim').files.exists('x'), NotFound);
  });
});

describe('claim lifecycle', () => {
  it('renew, suspend, resume, refresh, release', async () => {
    const sb = await client.claim(kPool, {ttl: '5m', wait: '60s'});
    try {
      const before = sb.claim!.expiresAt!.getTime();
      const renewed = await sb.renew('20m');
      assert.ok(renewed.expiresAt!.getTime() > before + 10 * 60 * 1000);
      assert.equal((await sb.suspend()).suspended, true);
      await assert.rejects(sb.exec('true'), FailedPrecondition);
      assert.equal((await sb.suspend()).suspended, true);  // idempotent
      assert.equal((await sb.resume()).suspended, false);
      assert.equal((await sb.exec('echo back')).stdout, 'back\n');
      assert.equal((await client.sandbox(sb.claimId).refresh()).sandbox.id, sb.sandboxId);
    } finally {
      assert.equal((await sb.release()).state, 'released');
    }
    assert.equal((await sb.release()).state, 'released');  // idempotent
    await assert.rejects(sb.exec('true'), FailedPrecondition);
  });

  it('await using releases when the block throws', async () => {
    let id = '';
    await assert.rejects((async () => {
      await using sb = await client.claim(kPool, {wait: '60s'});
      id = sb.claimId;
      assert.equal(await stateOf(id), 'active');
      throw new Error('boom');
    })(), /boom/);
    assert.equal(await stateOf(id), 'released');
  });

  it('try/finally with release() releases when the body throws', async () => {
    let id = '';
    await assert.rejects((async () => {
      const sb = await client.claim(kPool, {wait: '60s'});
      try {
        id = sb.claimId;
        await sb.exec('exit 1');
        throw new Error('body failed');
      } finally {
        await sb.release();
      }
    })(), /body failed/);
    assert.equal(await stateOf(id), 'released');
  });

  it('claimBatch returns a group; await using releases all of them', async () => {
    // This server's ClaimBatch takes what is warm at once (RESOURCE_EXHAUSTED otherwise,
    // whatever the policy), so wait until the pool holds two warm sandboxes.
    await waitFor('2 warm sandboxes', async () => (await client.pools())[0]!.status.warm >= 2, 60000);
    let ids: string[] = [];
    {
      await using group = await client.claimBatch(kPool, 2, {wait: '60s', id: `batch-${process.pid}`, labels: {b: '1'}});
      assert.equal(group.length, 2);
      ids = group.sandboxes.map((s) => s.claimId);
      assert.deepEqual(ids, [0, 1].map((i) => `batch-${process.pid}#${i}`));
      assert.equal(new Set(group.sandboxes.map((s) => s.sandboxId)).size, 2);
      const outs = await Promise.all([...group].map((s) => s.exec('echo $((6*7))')));
      assert.deepEqual(outs.map((o) => o.stdout), ['42\n', '42\n']);
    }
    for (const id of ids) assert.equal(await stateOf(id), 'released');
  });
});

describe('client', () => {
  it('ping, pools, listClaims, watchClaims', async () => {
    const pong = await client.ping();
    assert.match(pong.serverVersion, /^\d+\.\d+/);
    const pools = await client.pools();
    assert.deepEqual(pools.map((p) => p.name), [kPool]);
    assert.equal(pools[0]!.emptyPoolPolicy, 'wait');

    const sb = await client.claim(kPool, {wait: '60s', labels: {w: '1'}});
    const listed = await client.listClaims({selector: 'w=1', states: ['active']});
    assert.deepEqual(listed.map((c) => c.claimId), [sb.claimId]);
    // From revision 0 the watch first sends the current claim (ADDED, initial); the
    // release after it is then a MODIFIED event of the same stream.
    const events: ClaimEvent[] = [];
    for await (const ev of client.watchClaims({selector: 'w=1'})) {
      events.push(ev);
      if (ev.type === 'added') await sb.release();
      if (ev.type === 'modified' && ev.claim.state === 'released') break;
    }
    assert.deepEqual(events.map((e) => [e.type, e.initial, e.claim.claimId, e.claim.state]),
                     [['added', true, sb.claimId, 'active'], ['modified', false, sb.claimId, 'released']]);
    assert.ok(events[1]!.revision > events[0]!.revision);
    assert.deepEqual(await client.listClaims({selector: 'w=1', states: ['active']}), []);
  });

  it('watchClaims ends with Cancelled when its signal aborts', async () => {
    const ac = new AbortController();
    const it = client.watchClaims({pool: kPool, signal: ac.signal, startRevision: 0});
    const first = it.next();  // the stream is open once this is pending
    setTimeout(() => ac.abort(), 50);
    // Claims may exist (initial ADDED events): read until the abort ends the stream.
    const err = await (async () => {
      try {
        await first;
        for (;;) if ((await it.next()).done) return null;
      } catch (e) {
        return e;
      }
    })();
    assert.ok(err instanceof Cancelled, `got ${err}`);
  });
});

describe('examples', () => {
  it('examples/quickstart.mjs runs against the server', async () => {
    const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
    const {stdout} = await promisify(execFile)(process.execPath, [path.join(root, 'examples/quickstart.mjs')],
                                               {env: {...process.env, SBX_SERVER: server.target}, timeout: 60000});
    assert.match(stdout, /hello from the sandbox/);
    assert.match(stdout, /released/);
  });

  it('examples/await_using.ts runs and releases its claim', async () => {
    const built = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../examples/await_using.js');
    const {stdout} = await promisify(execFile)(process.execPath, [built],
                                               {env: {...process.env, SBX_SERVER: server.target}, timeout: 60000});
    const m = /^42 \(exit 0\) in \S+ of claim (\S+)$/m.exec(stdout);
    assert.ok(m, stdout);
    assert.equal(await stateOf(m[1]!), 'released');
  });
});
