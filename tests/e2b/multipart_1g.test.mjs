// A 1 GiB multipart/form-data upload (the form the E2B SDK's files.write sends for
// strings, bytes and blobs) through sbx's E2B front, streamed into the sandbox part by
// part: the bytes reach the file whole (SHA-256 checked by `sha256sum` inside), and the
// server's resident memory, sampled from /proc while the upload runs, stays far below
// what holding the body would cost. The body is generated as it is sent (chunked), so the
// test itself holds no more than a MiB of it.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import {after, before, test} from 'node:test';

import {Sandbox} from 'e2b';

import {TestServer} from './harness.mjs';

// The pool "default" with a workspace (a tmpfs, charged to the sandbox's memory) that
// holds the file: 1.25 GiB, and 2 GiB of memory.
const config = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-e2b-1g-')), 'config.yaml');
fs.writeFileSync(config, `templates:
  - name: default
    runtime: local
    local:
      network: false
      memory_limit_bytes: ${2 * 1024 ** 3}
      pids_limit: 512
      workspace_size_bytes: ${1.25 * 1024 ** 3}
pools:
  - name: default
    template: default
    min_warm: 1
    max_warm: 2
    empty_pool_policy: wait
    default_wait: 30s
    default_ttl: 1h
    max_ttl: 24h
`);
process.env.SBX_TEST_CONFIG = config;
const server = new TestServer();
let sbx;

before(async () => {
  await server.start();
  server.useFromE2b();
  sbx = await Sandbox.create('default', {timeoutMs: 600_000});
});

after(async () => {
  if (sbx) await sbx.kill().catch(() => {});
  await server.cleanUp();
  fs.rmSync(path.dirname(config), {recursive: true, force: true});
});

function memKiB(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return {hwm: Number(/VmHWM:\s+(\d+)/.exec(status)[1]), rss: Number(/VmRSS:\s+(\d+)/.exec(status)[1])};
}

test('a 1 GiB multipart upload at constant server memory', async (t) => {
  const MiB = 1 << 20;
  const fileMiB = 1024;
  const boundary = '----formdata-sbx-test-0123456789';
  const want = crypto.createHash('sha256');
  const before = memKiB(server.proc.pid);
  let maxRss = before.rss;
  const sampler = setInterval(() => { maxRss = Math.max(maxRss, memKiB(server.proc.pid).rss); }, 50);
  let answer;
  try {
    answer = await new Promise((resolve, reject) => {
      const req = http.request({
        host: '127.0.0.1', port: server.e2bPort, method: 'POST', path: '/files?username=user',
        headers: {'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken,
                  'Content-Type': `multipart/form-data; boundary=${boundary}`},
      }, (res) => {
        let text = '';
        res.on('data', (d) => { text += d; });
        res.on('end', () => resolve({status: res.statusCode, body: text}));
      });
      req.on('error', reject);
      const head = (name) => `--${boundary}\r\nContent-Disposition: form-data; name="file"; ` +
                             `filename="${name}"\r\nContent-Type: application/octet-stream\r\n\r\n`;
      const parts = [head('/home/user/big/one-gib.bin')];
      let sent = 0;
      const chunk = Buffer.alloc(MiB);
      // Writes as the socket drains: the client never runs ahead of the server.
      const pump = () => {
        while (true) {
          if (parts.length > 0) {
            if (!req.write(parts.shift())) return req.once('drain', pump);
            continue;
          }
          if (sent === fileMiB) {
            // A second, small part after the big one, then the close delimiter.
            req.end(`\r\n${head('/home/user/big/after.txt')}after the big one\r\n--${boundary}--\r\n`);
            return;
          }
          crypto.randomFillSync(chunk);
          want.update(chunk);
          sent++;
          if (!req.write(Buffer.from(chunk))) return req.once('drain', pump);
        }
      };
      pump();
    });
  } finally {
    clearInterval(sampler);
  }
  assert.equal(answer.status, 200, answer.body);
  assert.deepEqual(JSON.parse(answer.body).map((e) => e.path),
                   ['/home/user/big/one-gib.bin', '/home/user/big/after.txt']);
  const expected = want.digest('hex');
  const sum = await sbx.commands.run('sha256sum big/one-gib.bin; cat big/after.txt', {timeoutMs: 120_000});
  assert.equal(sum.stdout, `${expected}  big/one-gib.bin\nafter the big one`);

  const afterUpload = memKiB(server.proc.pid);
  const grewMiB = (Math.max(maxRss, afterUpload.hwm) - Math.max(before.hwm, before.rss)) / 1024;
  t.diagnostic(`server RSS ${before.rss} KiB before, at most ${maxRss} KiB sampled during the upload; ` +
               `peak ${before.hwm} -> ${afterUpload.hwm} KiB (+${grewMiB.toFixed(1)} MiB for ${fileMiB} MiB sent)`);
  assert.ok(grewMiB < 64, `the server's memory grew by ${grewMiB.toFixed(1)} MiB for a ${fileMiB} MiB upload`);
});
