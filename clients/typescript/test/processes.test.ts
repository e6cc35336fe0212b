// sb.processes, sb.pty, sb.url and the streamed files of the TypeScript SDK against a
// real sbx-server (local runtime, bubblewrap sandboxes without network) with its port
// proxy on 127.0.0.1:0 and two tenants:
// - a background process found again by tag from a second client: replay, then live
//   output, stdin, a signal from that client, its exit seen by the first;
// - a PTY whose `stty size` shows the effect of resize();
// - 64 MiB up and down streamed, sha256 checked on both sides, with the client's Buffer
//   memory (after forced GCs) far below the file's size: nothing is buffered whole;
// - uploadDir/downloadDir round trip, watch();
// - url() then a fetch through the port proxy without the tenant's token;
// - tenant B's SDK cannot connect to, signal, wait for, write to or get a URL of A's
//   process or port: NotFound, and A's process keeps running.
import assert from 'node:assert/strict';
import {createHash} from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {after, before, describe, it} from 'node:test';
import v8 from 'node:v8';
import vm from 'node:vm';

import {
  AlreadyExists, Client, FailedPrecondition, InvalidArgument, NotFound, Sandbox, type SandboxProcess,
} from '@sbx/client';

import {TestServer, waitFor} from './harness.js';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const kHttpPort = 8766;
let server: TestServer;
let client: Client;
let other: Client;
let tenantB: Client;
let proxyPort = 0;

before(async () => {
  server = new TestServer({
    runtime: 'local', tokens: ['tok-a tenant-a', 'tok-b tenant-b'],
    extraArgs: ['--proxy_listen=127.0.0.1:0', '--proxy_port_file=proxy_port'],
  });
  await server.start();
  await waitFor('the proxy port', () => fs.existsSync(path.join(server.dir, 'proxy_port')));
  proxyPort = Number(fs.readFileSync(path.join(server.dir, 'proxy_port'), 'utf8').trim());
  client = new Client({server: server.target, token: 'tok-a'});
  other = new Client({server: server.target, token: 'tok-a'});
  tenantB = new Client({server: server.target, token: 'tok-b'});
});

after(async () => {
  client?.close();
  other?.close();
  tenantB?.close();
  await server?.cleanUp();
});

/** Reads a process's output until `re` matches what came so far (bounded). */
async function readUntil(p: SandboxProcess, re: RegExp, ms = 20000): Promise<string> {
  let seen = '';
  const timer = setTimeout(() => p.detach(), ms);
  try {
    for await (const out of p) {
      seen += out.data.toString('latin1');
      if (re.test(seen)) return seen;
    }
  } finally {
    clearTimeout(timer);
  }
  throw new Error(`${re} not seen within ${ms} ms in ${JSON.stringify(seen)}`);
}

describe('processes', () => {
  it('a background process is found by tag from a second client: replay, live, stdin, signal, wait', async () => {
    await using sb = await client.claim('default', {ttl: '10m', wait: '60s'});
    const proc = await sb.processes.start('echo ready; while read l; do echo "got $l"; done', {tag: 'echoer', stdin: true});
    assert.ok(proc.pid > 0);
    assert.equal(proc.tag, 'echoer');
    const listed = (await sb.processes.list()).find((p) => p.tag === 'echoer');
    assert.ok(listed && listed.exit === null && listed.stdinOpen && listed.pid === proc.pid);

    const sb2 = other.sandbox(sb.claimId);
    const p2 = await sb2.processes.connect('echoer');
    assert.equal(p2.pid, proc.pid);
    await readUntil(p2, /ready\n/);
    await proc.sendStdin('hello\n');
    await readUntil(p2, /got hello\n/);
    await p2.kill('SIGTERM');
    assert.equal((await proc.wait({timeoutMs: 30000})).signal, 15);
    assert.equal((await p2.wait({timeoutMs: 30000})).signal, 15);
    p2.detach();
    await assert.rejects(proc.kill(), FailedPrecondition);
  });

  it('foreground start, stdin close, exit codes, and the server errors as typed errors', async () => {
    await using sb = await client.claim('default', {ttl: '10m', wait: '60s'});
    const cat = await sb.processes.start(['sh', '-c', 'cat; echo err >&2; exit 7'], {stdin: true, background: false});
    await cat.sendStdin('abc');
    await cat.closeStdin();
    let out = '';
    let err = '';
    for await (const o of cat) (o.stream === 'stderr' ? (err += o.data) : (out += o.data));
    assert.equal(out, 'abc');
    assert.equal(err, 'err\n');
    assert.equal(cat.exitStatus?.exitCode, 7);

    await sb.processes.start('sleep 60', {tag: 'dup'});
    await assert.rejects(sb.processes.start('sleep 60', {tag: 'dup'}), (e) => e instanceof AlreadyExists && /dup/.test(e.details));
    await assert.rejects(sb.processes.connect('nosuch'), NotFound);
    await assert.rejects(sb.processes.sendStdin('dup', 'x'), FailedPrecondition);
    await assert.rejects(sb.processes.start('true', {tag: 'bad tag'}), InvalidArgument);
    await assert.rejects(sb.processes.kill(0), InvalidArgument);
    await sb.processes.kill('dup');
    assert.equal((await sb.processes.wait('dup', {timeoutMs: 30000})).signal, 9);
  });

  it('a PTY shows the effect of resize in stty size', async () => {
    await using sb = await client.claim('default', {ttl: '10m', wait: '60s'});
    const pty = await sb.pty({cols: 80, rows: 24, cmd: ['sh']});
    try {
      await pty.sendInput('stty size\n');
      await readUntil(pty, /\b24 80\r?\n/);
      await pty.resize(100, 40);
      await pty.sendInput('stty size\n');
      await readUntil(pty, /\b40 100\r?\n/);
      await pty.sendInput('exit 3\n');
      assert.equal((await pty.wait({timeoutMs: 30000})).exitCode, 3);
      const info = (await sb.processes.list()).find((p) => p.pid === pty.pid);
      assert.deepEqual(info?.pty, {cols: 100, rows: 40});
    } finally {
      pty.detach();
    }
  });
});

describe('streamed files', () => {
  it('64 MiB up and down in constant client memory, sha256 checked', async () => {
    await using sb = await client.claim('default', {ttl: '10m', wait: '60s'});
    const mib = 1024 * 1024;
    const size = 64 * mib;
    const want = createHash('sha256');
    let peak = 0;
    const sample = () => {
      gc();
      peak = Math.max(peak, process.memoryUsage().arrayBuffers);
    };
    gc();
    const base = process.memoryUsage().arrayBuffers;
    // A generated source (pseudo-random, so compression or dedup cannot help anything).
    async function* source() {
      let x = 0x12345678;
      for (let i = 0; i < size / mib; i++) {
        const b = Buffer.allocUnsafe(mib);
        for (let j = 0; j < mib; j += 4) {
          x = (Math.imul(x, 1103515245) + 12345) >>> 0;
          b.writeUInt32LE(x, j);
        }
        want.update(b);
        if (i % 8 === 0) sample();
        yield b;
      }
    }
    assert.equal(await sb.files.upload('big/blob.bin', source()), size);
    const upPeak = peak;
    peak = 0;
    const digest = want.digest('hex');
    const inside = await sb.exec(['sha256sum', 'big/blob.bin']);
    assert.equal(inside.stdout.split(' ')[0], digest);
    const got = createHash('sha256');
    let n = 0;
    let i = 0;
    for await (const chunk of sb.files.download('big/blob.bin')) {
      got.update(chunk);
      n += chunk.length;
      if (++i % 32 === 0) sample();
    }
    assert.equal(n, size);
    assert.equal(got.digest('hex'), digest);
    console.log(`# client Buffer memory grew by ${((upPeak - base) / mib).toFixed(1)} MiB (upload), ${((peak - base) / mib).toFixed(1)} MiB (download) at most`);
    peak = Math.max(peak, upPeak);
    // Whole buffering would hold at least the file's 64 MiB. What is seen is a window of
    // chunks: up to ~6 MiB going up; coming down up to ~25 MiB when the server sends
    // faster than this loop hashes (grpc-js's stream and HTTP/2 buffers), whatever the
    // file's size.
    assert.ok(peak - base < 48 * mib, `client buffers grew by ${(peak - base) / mib} MiB for a 64 MiB transfer`);

    // A source that fails half-way: the upload rejects with its error, the sandbox keeps
    // nothing (the call is cancelled before `finish`).
    async function* failing() {
      yield Buffer.alloc(mib, 1);
      yield Buffer.alloc(mib, 2);
      throw new Error('disk gone');
    }
    await assert.rejects(sb.files.upload('big/partial.bin', failing()), /disk gone/);
    assert.equal(await sb.files.exists('big/partial.bin'), false);

    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-ts-dl-'));
    try {
      assert.equal(await sb.files.downloadFile('big/blob.bin', path.join(dir, 'b.bin')), size);
      assert.equal(fs.statSync(path.join(dir, 'b.bin')).size, size);
    } finally {
      fs.rmSync(dir, {recursive: true, force: true});
    }
  });

  it('uploadDir, downloadDir (links skipped), watch and stat', async () => {
    await using sb = await client.claim('default', {ttl: '10m', wait: '60s'});
    const src = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-ts-up-'));
    const dst = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-ts-down-'));
    try {
      fs.mkdirSync(path.join(src, 'a/b'), {recursive: true});
      fs.writeFileSync(path.join(src, 'a/b/c.txt'), 'deep');
      fs.writeFileSync(path.join(src, 'top.txt'), 'top');
      const watch = await sb.files.watch('proj', {recursive: true}).catch(() => null);
      assert.ok(await sb.files.uploadDir(src, 'proj') >= 4);
      assert.equal((await sb.files.readText('proj/a/b/c.txt')), 'deep');
      assert.equal((await sb.files.stat('proj/top.txt')).size, 3);
      // A link in the sandbox pointing out: never made on this side.
      await sb.exec('ln -s /etc/passwd proj/evil');
      assert.equal(await sb.files.downloadDir('proj', dst), 4);
      assert.equal(fs.readFileSync(path.join(dst, 'a/b/c.txt'), 'utf8'), 'deep');
      assert.equal(fs.existsSync(path.join(dst, 'evil')), false);
      watch?.close();

      const w = await sb.files.watch('');
      await sb.files.write('new.txt', 'x');
      let seen = false;
      const timer = setTimeout(() => w.close(), 20000);
      for await (const ev of w) {
        if (ev.path.endsWith('new.txt')) {
          seen = true;
          break;
        }
      }
      clearTimeout(timer);
      w.close();
      assert.ok(seen);
    } finally {
      fs.rmSync(src, {recursive: true, force: true});
      fs.rmSync(dst, {recursive: true, force: true});
    }
  });
});

describe('ports', () => {
  it('url() then a fetch through the port proxy, without the token', async () => {
    await using sb = await client.claim('default', {ttl: '10m', wait: '60s'});
    await sb.files.write('site/hello.txt', 'hello via proxy\n');
    const web = await sb.processes.start(['python3', '-m', 'http.server', String(kHttpPort), '--bind', '127.0.0.1'],
                                         {cwd: 'site', tag: 'web'});
    const probe = `import socket,time,sys\nfor i in range(400):\n  try: socket.create_connection(('127.0.0.1',${kHttpPort})).close(); sys.exit(0)\n  except OSError: time.sleep(0.05)\nsys.exit(1)\n`;
    assert.equal((await sb.exec(['python3', '-c', probe])).exitCode, 0);
    const u = await sb.url(kHttpPort, {ttl: '2m'});
    assert.ok(u.url.includes(`:${proxyPort}/_sbx/${sb.claimId}/${kHttpPort}/`), u.url);
    assert.ok(u.token.length > 0);
    assert.ok(u.expiresAt !== null && u.expiresAt.getTime() > Date.now());
    const [base, query] = u.url.split('?');
    const r = await fetch(`${base}hello.txt?${query}`);
    assert.equal(r.status, 200);
    assert.equal(await r.text(), 'hello via proxy\n');
    await assert.rejects(sb.url(kHttpPort, {ttl: '200h'}), InvalidArgument);
    await assert.rejects(sb.url(0), InvalidArgument);
    await web.kill();
    await web.wait({timeoutMs: 30000});
  });
});

describe('tenant isolation through the SDK', () => {
  it("tenant B cannot reach A's process or port: NotFound, and A's process runs on", async () => {
    await using sb = await client.claim('default', {ttl: '10m', wait: '60s'});
    const proc = await sb.processes.start('sleep 300', {tag: 'secret', stdin: true});
    const b: Sandbox = tenantB.sandbox(sb.claimId);
    const attempts: Array<[string, () => Promise<unknown>]> = [
      ['connect by tag', () => b.processes.connect('secret')],
      ['connect by pid', () => b.processes.connect(proc.pid)],
      ['kill', () => b.processes.kill(proc.pid)],
      ['wait', () => b.processes.wait('secret', {timeoutMs: 5000})],
      ['stdin', () => b.processes.sendStdin(proc.pid, 'rm -rf /\n')],
      ['list', () => b.processes.list()],
      ['pty', () => b.pty({cmd: ['sh']})],
      ['url', () => b.url(kHttpPort)],
    ];
    for (const [what, attempt] of attempts) {
      await assert.rejects(attempt(), (e) => e instanceof NotFound && e.details.includes(sb.claimId), what);
    }
    const info = await proc.info();
    assert.equal(info.exit, null);
    assert.equal(info.readers, 0);
    await proc.kill();
  });
});
