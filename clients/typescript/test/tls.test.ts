// TLS options against real servers (--runtime instant) with certificates made by openssl:
// `ca` (a file path or PEM text), `serverName`, mutual TLS with `cert` + `key`, and the
// failures when the client cannot verify the server or has no client certificate.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {after, before, it} from 'node:test';

import {Client, Unavailable} from '@sbx/client';

import {instantConfig, TestServer} from './harness.js';

let certs = '';
let tls: TestServer | undefined;
let mtls: TestServer | undefined;
const clients: Client[] = [];

function client(opts: ConstructorParameters<typeof Client>[0]): Client {
  const c = new Client({timeoutMs: 3000, ...opts});
  clients.push(c);
  return c;
}

before(async () => {
  certs = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-ts-certs-'));
  const openssl = (...args: string[]) => execFileSync('openssl', args, {cwd: certs, stdio: 'pipe', timeout: 60000});
  openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '1',
          '-subj', '/CN=sbx-ts-test-ca');
  fs.writeFileSync(path.join(certs, 'san.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:sbx.test\n');
  for (const [name, ext] of [['server', ['-extfile', 'san.cnf']], ['client', []]] as const) {
    openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`);
    openssl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
            '-out', `${name}.pem`, '-days', '1', ...ext);
  }
  const config = instantConfig([{name: 'default', warm: 2}]);
  const serverTls = [`--tls_cert_file=${certs}/server.pem`, `--tls_key_file=${certs}/server.key`];
  tls = new TestServer({runtime: 'instant', config, extraArgs: serverTls});
  await tls.start();
  mtls = new TestServer({runtime: 'instant', config, extraArgs: [...serverTls, `--tls_client_ca_file=${certs}/ca.pem`]});
  await mtls.start();
});

after(async () => {
  for (const c of clients) c.close();
  await tls?.cleanUp();
  await mtls?.cleanUp();
  if (certs) fs.rmSync(certs, {recursive: true, force: true});
});

it('TLS with a CA file, with PEM text, and with serverName', async () => {
  const byFile = client({server: tls!.target, ca: `${certs}/ca.pem`});
  assert.match((await byFile.ping()).serverVersion, /\d/);
  await (await byFile.claim('default')).release();
  const byText = client({server: tls!.target, ca: fs.readFileSync(`${certs}/ca.pem`, 'utf8')});
  assert.match((await byText.ping()).serverVersion, /\d/);
  const named = client({server: tls!.target, ca: fs.readFileSync(`${certs}/ca.pem`), serverName: 'sbx.test'});
  assert.match((await named.ping()).serverVersion, /\d/);
});

// One attempt each: retries would end the same way, only later (or cut by the deadline).
const once = {retry: {maxAttempts: 1}};

it('no connection without trusting the CA, in plaintext, or under another name', async () => {
  await assert.rejects(client({server: tls!.target, ...once}).ping(), Unavailable);
  await assert.rejects(client({server: tls!.target, tls: true, ...once}).ping(), Unavailable);
  await assert.rejects(client({server: tls!.target, ca: `${certs}/ca.pem`, serverName: 'other.test', ...once}).ping(), Unavailable);
});

it('mutual TLS needs the client certificate', async () => {
  const c = client({server: mtls!.target, ca: `${certs}/ca.pem`, cert: `${certs}/client.pem`, key: `${certs}/client.key`});
  await (await c.claim('default')).release();
  await assert.rejects(client({server: mtls!.target, ca: `${certs}/ca.pem`, ...once}).ping(), Unavailable);
  assert.throws(() => new Client({server: mtls!.target, cert: `${certs}/client.pem`}), /cert and key/);
  assert.throws(() => new Client({server: mtls!.target, ca: `${certs}/nope.pem`}), /nope\.pem/);
});
