// envd's files through sbx's E2B front, driven by the unmodified `e2b` SDK against a real
// sbx-server with the local runtime: files.write / read (REST /files: multipart, and a
// stream as application/octet-stream), list, exists, makeDir, rename, remove, getInfo;
// E2B's /home/user is the sandbox's workspace, other absolute paths are refused; a
// 100 MB upload and download, content checked by SHA-256, with the server's peak memory
// not growing by anything near the file's size.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import {after, before, test} from 'node:test';

import {FileNotFoundError, InvalidArgumentError, Sandbox} from 'e2b';

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

test('write, read, list, exists, makeDir, rename, remove', async () => {
  const info = await sbx.files.write('/home/user/notes/a.txt', 'hello from e2b\n');
  assert.equal(info.path, '/home/user/notes/a.txt');
  assert.equal(info.name, 'a.txt');
  assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'hello from e2b\n');
  // Relative paths are relative to the workspace, as to E2B's home.
  assert.equal(await sbx.files.read('notes/a.txt'), 'hello from e2b\n');
  // The command sees the same file in $HOME.
  assert.equal((await sbx.commands.run('cat "$HOME/notes/a.txt"')).stdout, 'hello from e2b\n');

  const bytes = new Uint8Array([0, 1, 2, 255, 254, 10, 13]);
  await sbx.files.write('/home/user/notes/b.bin', bytes);
  assert.deepEqual(await sbx.files.read('/home/user/notes/b.bin', {format: 'bytes'}), bytes);
  await sbx.files.write('/home/user/notes/empty', '');
  assert.equal(await sbx.files.read('/home/user/notes/empty'), '');

  const many = await sbx.files.write([{path: '/home/user/m/1.txt', data: 'one'},
                                      {path: '/home/user/m/2.txt', data: 'two'}]);
  assert.deepEqual(many.map((f) => f.path).sort(), ['/home/user/m/1.txt', '/home/user/m/2.txt']);
  assert.equal(await sbx.files.read('/home/user/m/2.txt'), 'two');

  const listed = await sbx.files.list('/home/user/notes');
  assert.deepEqual(listed.map((e) => [e.name, e.type]).sort(),
                   [['a.txt', 'file'], ['b.bin', 'file'], ['empty', 'file']]);
  const a = listed.find((e) => e.name === 'a.txt');
  assert.equal(a.path, '/home/user/notes/a.txt');
  assert.equal(a.size, 15);

  assert.equal(await sbx.files.exists('/home/user/notes/a.txt'), true);
  assert.equal(await sbx.files.exists('/home/user/notes/nope'), false);
  const stat = await sbx.files.getInfo('/home/user/notes');
  assert.equal(stat.type, 'dir');
  assert.equal(stat.name, 'notes');

  assert.equal(await sbx.files.makeDir('/home/user/d1/d2'), true);
  assert.equal(await sbx.files.makeDir('/home/user/d1/d2'), false, 'exists: false');
  assert.equal((await sbx.files.getInfo('/home/user/d1/d2')).type, 'dir');

  const moved = await sbx.files.rename('/home/user/notes/a.txt', '/home/user/d1/d2/moved.txt');
  assert.equal(moved.path, '/home/user/d1/d2/moved.txt');
  assert.equal(await sbx.files.exists('/home/user/notes/a.txt'), false);
  assert.equal(await sbx.files.read('/home/user/d1/d2/moved.txt'), 'hello from e2b\n');

  await sbx.files.remove('/home/user/d1');
  assert.equal(await sbx.files.exists('/home/user/d1/d2/moved.txt'), false);
  assert.equal(await sbx.files.exists('/home/user/d1'), false);

  await assert.rejects(sbx.files.read('/home/user/missing.txt'), FileNotFoundError);
  await assert.rejects(sbx.files.list('/home/user/missing'), FileNotFoundError);
  // Other absolute paths are the sandbox's own, as its processes see them: /tmp is
  // writable, /etc is what the sandbox sees (read-only), never the host's files.
  await sbx.files.write('/tmp/e2b-abs.txt', 'in the sandbox\n');
  assert.equal((await sbx.commands.run('cat /tmp/e2b-abs.txt')).stdout, 'in the sandbox\n');
  assert.equal(await sbx.files.read('/tmp/e2b-abs.txt'), 'in the sandbox\n');
  assert.equal(fs.existsSync('/tmp/e2b-abs.txt'), false, 'written inside, not on the host');
  assert.equal(await sbx.files.read('/etc/passwd'),
               (await sbx.commands.run('cat /etc/passwd')).stdout);
  await assert.rejects(sbx.files.write('/etc/evil', 'x'));
  assert.equal(fs.existsSync('/etc/evil'), false);
  await assert.rejects(sbx.files.read('/home/user/../../etc/passwd'), InvalidArgumentError);
});

// Deterministic pseudo-random bytes, `chunks` of 1 MiB, from a SHA-256 counter.
function* pseudoRandomChunks(chunks) {
  for (let i = 0; i < chunks; i++) {
    const out = Buffer.alloc(1 << 20);
    for (let off = 0; off < out.length; off += 32) {
      crypto.createHash('sha256').update(`${i}:${off}`).digest().copy(out, off);
    }
    yield out;
  }
}

function peakRssKiB(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return {hwm: Number(/VmHWM:\s+(\d+)/.exec(status)[1]), rss: Number(/VmRSS:\s+(\d+)/.exec(status)[1])};
}

test('a 100 MB upload and download at constant memory', async (t) => {
  const chunks = 100;
  const want = crypto.createHash('sha256');
  const gen = pseudoRandomChunks(chunks);
  const stream = new ReadableStream({
    pull(controller) {
      const next = gen.next();
      if (next.done) return controller.close();
      want.update(next.value);
      controller.enqueue(new Uint8Array(next.value));
    },
  });
  const before = peakRssKiB(server.proc.pid);
  const info = await sbx.files.write('/home/user/big.bin', stream, {requestTimeoutMs: 120_000});
  assert.equal(info.path, '/home/user/big.bin');
  const expected = want.digest('hex');
  const stat = await sbx.files.getInfo('/home/user/big.bin');
  assert.equal(stat.size, chunks << 20);

  const got = crypto.createHash('sha256');
  let size = 0;
  const body = await sbx.files.read('/home/user/big.bin', {format: 'stream', requestTimeoutMs: 120_000});
  for await (const part of body) {
    got.update(part);
    size += part.length;
  }
  assert.equal(size, chunks << 20);
  assert.equal(got.digest('hex'), expected);
  assert.equal((await sbx.commands.run('sha256sum big.bin')).stdout.split(' ')[0], expected);

  // The server's peak resident memory grew by far less than the 100 MiB that went through
  // it each way (what a body held whole would cost).
  const afterBoth = peakRssKiB(server.proc.pid);
  const grewMiB = (afterBoth.hwm - Math.max(before.hwm, before.rss)) / 1024;
  t.diagnostic(`server peak RSS ${before.hwm} -> ${afterBoth.hwm} KiB (+${grewMiB.toFixed(1)} MiB)`);
  assert.ok(grewMiB < 48, `the server's peak RSS grew by ${grewMiB.toFixed(1)} MiB ` +
            `(${before.hwm} -> ${afterBoth.hwm} KiB)`);
});
