// The E2B listener with TLS (the gRPC port's --tls_cert_file / --tls_key_file): the
// unmodified E2B SDK creates a sandbox, runs a command and moves a file over HTTPS (a
// child node trusting the test's certificate), and plain HTTP to the port gets no answer.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {after, before, test} from 'node:test';

import {ALICE, TestServer} from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
let server;

before(async () => {
  const probe = new TestServer();
  const dir = probe.dir;
  // A self-signed certificate for 127.0.0.1.
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
    '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1',
    '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem')], {stdio: 'ignore'});
  probe.extraArgs = [`--tls_cert_file=${path.join(dir, 'cert.pem')}`,
                     `--tls_key_file=${path.join(dir, 'key.pem')}`, '--proxy_listen=127.0.0.1:0'];
  server = probe;
  await server.start();
});

after(async () => {
  if (server) await server.cleanUp();
});

test('the E2B SDK over HTTPS', () => {
  const url = `https://127.0.0.1:${server.e2bPort}`;
  const out = execFileSync(process.execPath, [path.join(here, 'tls_client.mjs')], {
    cwd: here,
    env: {...process.env, NODE_EXTRA_CA_CERTS: path.join(server.dir, 'cert.pem'), E2B_API_URL: url,
          E2B_SANDBOX_URL: url, E2B_API_KEY: ALICE},
    timeout: 60_000,
  }).toString();
  assert.deepEqual(JSON.parse(out.trim().split('\n').pop()), {stdout: 'over-tls\n', read: 'tls file'});
});

test('plain HTTP to the TLS listener gets no HTTP answer', async () => {
  const answer = await new Promise((resolve) => {
    const sock = net.connect(server.e2bPort, '127.0.0.1');
    let text = '';
    const done = () => { clearTimeout(timer); sock.destroy(); resolve(text); };
    const timer = setTimeout(done, 5000);
    sock.on('data', (d) => { text += d; });
    sock.on('close', done);
    sock.on('error', done);
    sock.write('GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n');
  });
  assert.doesNotMatch(answer, /^HTTP\/1\.1 200/);
});

// An HTTPS request to the E2B listener, trusting the test's certificate.
function httpsRequest(method, pathname, headers, body) {
  return new Promise((resolve, reject) => {
    const req = https.request({host: '127.0.0.1', port: server.e2bPort, method, path: pathname, headers,
                               ca: fs.readFileSync(path.join(server.dir, 'cert.pem')), agent: false}, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({status: res.statusCode, headers: res.headers, body: text}));
    });
    req.on('error', reject);
    req.end(body);
  });
}

// A TLS listener cannot hand its connection to the port proxy: port traffic is redirected
// to the proxy instead (a URL token for this sandbox and port), and refused without the
// sandbox's access token.
test('port traffic over TLS is redirected to the port proxy', async () => {
  const created = await httpsRequest('POST', '/sandboxes', {'X-API-Key': ALICE, 'Content-Type': 'application/json'},
                                     JSON.stringify({templateID: 'default', timeout: 60}));
  assert.equal(created.status, 201, created.body);
  const sbx = JSON.parse(created.body);
  try {
    const headers = {'E2b-Sandbox-Id': sbx.sandboxID, 'E2b-Sandbox-Port': '8000'};
    const res = await httpsRequest('GET', '/some/path?x=1', {...headers, 'X-Access-Token': sbx.envdAccessToken});
    assert.equal(res.status, 307, res.body);
    const location = new URL(res.headers.location);
    assert.equal(location.pathname, `/_sbx/${sbx.sandboxID}/8000/some/path`);
    assert.equal(location.searchParams.get('x'), '1');
    assert.ok(location.searchParams.get('sbx_token'));
    const refused = await httpsRequest('GET', '/some/path', headers);
    assert.equal(refused.status, 401, refused.body);
    assert.equal(refused.headers.location, undefined);
  } finally {
    await httpsRequest('DELETE', `/sandboxes/${sbx.sandboxID}`, {'X-API-Key': ALICE});
  }
});
