// Which deadline each call of the SDK sends (docs/sdk-typescript.md, "Deadlines"): a fake
// sbx.v1 server (grpc-js) records the deadline every call arrives with and refuses it with
// FAILED_PRECONDITION, which is never retried, so each call is recorded once.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import {after, before, it} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Client, DeadlineExceeded, FailedPrecondition, type Sandbox, Unavailable} from '@sbx/client';

const kProtoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../dist/proto');
const kTimeoutMs = 7000;  // the client's timeoutMs here: no default's value
// The server sees a little less than what was sent (the call's way to it), or a little
// more: grpc-timeout goes as an integer of some unit, rounded up.
const kSlackMs = 1000;

// [method, ms left when it arrived; null: no deadline]
let seen: [string, number | null][] = [];
let server: grpc.Server;
let client: Client;

function record(method: string, call: {getDeadline(): grpc.Deadline}): grpc.ServiceError {
  const d = call.getDeadline();
  const at = d instanceof Date ? d.getTime() : d;
  seen.push([method, Number.isFinite(at) ? at - Date.now() : null]);
  return Object.assign(new Error(`recorded ${method}`), {
    code: grpc.status.FAILED_PRECONDITION, details: `recorded ${method}`, metadata: new grpc.Metadata(),
  });
}

// Every method of a service answered by record(), whatever its kind of stream.
function recorderOf(service: grpc.ServiceDefinition): grpc.UntypedServiceImplementation {
  const impl: grpc.UntypedServiceImplementation = {};
  for (const [name, m] of Object.entries(service)) {
    if (!m.requestStream && !m.responseStream) {
      impl[name] = (call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => cb(record(name, call));
    } else if (!m.requestStream) {
      impl[name] = (call: grpc.ServerWritableStream<unknown, unknown>) => call.emit('error', record(name, call));
    } else if (!m.responseStream) {
      impl[name] = (call: grpc.ServerReadableStream<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => cb(record(name, call));
    } else {
      impl[name] = (call: grpc.ServerDuplexStream<unknown, unknown>) => call.emit('error', record(name, call));
    }
  }
  return impl;
}

before(async () => {
  const def = protoLoader.loadSync(
      ['sbx/v1/claims.proto', 'sbx/v1/diagnostics.proto', 'sbx/v1/sandboxes.proto', 'sbx/v1/admin.proto'],
      {includeDirs: [kProtoDir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true});
  const v1 = (grpc.loadPackageDefinition(def).sbx as grpc.GrpcObject).v1 as grpc.GrpcObject;
  server = new grpc.Server();
  for (const name of ['ClaimService', 'SandboxService', 'AdminService', 'DiagnosticsService']) {
    const service = (v1[name] as grpc.ServiceClientConstructor).service;
    server.addService(service, recorderOf(service));
  }
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  client = new Client({server: `127.0.0.1:${port}`, timeoutMs: kTimeoutMs});
});

after(() => {
  client?.close();
  server?.forceShutdown();
});

const T = kTimeoutMs;
// [what is called, the deadline docs/sdk-typescript.md gives it in ms; null: none]
const cases: [string, (c: Client, sb: Sandbox) => Promise<unknown>, number | null][] = [
  ['ping', (c) => c.ping(), T],
  ['claim', (c) => c.claim('p'), 30000 + T],
  ['claim policy fail', (c) => c.claim('p', {policy: 'fail'}), T],
  ['claim wait 3s', (c) => c.claim('p', {wait: '3s'}), 3000 + T],
  ['claim timeoutMs 2000 policy fail', (c) => c.claim('p', {policy: 'fail', timeoutMs: 2000}), 2000],
  ['claim wait 4s timeoutMs 2000', (c) => c.claim('p', {wait: '4s', timeoutMs: 2000}), 6000],
  ['claimBatch', (c) => c.claimBatch('p', 2), 30000 + T],
  // By image the default wait is the on-demand pool's 5 minutes (a first pull).
  ['claim by image', (c) => c.claim({image: 'oci:/i:1'}), 300000 + T],
  ['claim by image wait 3s', (c) => c.claim({image: 'oci:/i:1'}, {wait: '3s'}), 3000 + T],
  ['claimBatch by image', (c) => c.claimBatch({image: 'oci:/i:1'}, 2), 300000 + T],
  ['claimBatch policy fail', (c) => c.claimBatch('p', 2, {policy: 'fail'}), T],
  ['getClaim', (c) => c.getClaim('c1'), T],
  ['release', (c) => c.release('c1'), T],
  ['listClaims', (c) => c.listClaims(), T],
  ['pools', (c) => c.pools(), T],
  ['ping timeoutMs 1500', (c) => c.ping({timeoutMs: 1500}), 1500],
  ['sandbox.release', (_, sb) => sb.release(), T],
  ['sandbox.refresh', (_, sb) => sb.refresh(), T],
  ['sandbox.renew', (_, sb) => sb.renew('1m'), T],
  ['sandbox.suspend', (_, sb) => sb.suspend(), T],
  ['sandbox.resume', (_, sb) => sb.resume(), T],
  ['sandbox.exec', (_, sb) => sb.exec('true'), 600000 + T],
  ['sandbox.exec timeout 5s', (_, sb) => sb.exec('true', {timeout: '5s'}), 5000 + T],
  ['files.write', (_, sb) => sb.files.write('f', 'x'), T],
  ['files.read', (_, sb) => sb.files.read('f'), T],
  ['files.list', (_, sb) => sb.files.list(), T],
  ['files.exists', (_, sb) => sb.files.exists('f'), T],
  ['files.remove', (_, sb) => sb.files.remove('f'), T],
];

it('every call sends the deadline the docs give it', async () => {
  const sb = client.sandbox('c1');
  const wrong: string[] = [];
  for (const [name, call, expected] of cases) {
    seen = [];
    await assert.rejects(call(client, sb), FailedPrecondition, name);
    assert.equal(seen.length, 1, `${name}: ${JSON.stringify(seen)}`);
    const got = seen[0][1];
    const rounding = expected !== null && expected >= 100000 ? 1500 : 250;
    if (expected === null ? got !== null : got === null || got < expected - kSlackMs || got > expected + rounding) {
      wrong.push(`${name}: sent ${got} ms, expected ${expected} ms`);
    }
  }
  assert.deepEqual(wrong, []);
});

it('watchClaims has no deadline: it lives until cancelled', async () => {
  seen = [];
  await assert.rejects((async () => {
    for await (const _ of client.watchClaims()) { /* the fake sends no event */ }
  })(), FailedPrecondition);
  assert.deepEqual(seen, [['WatchClaims', null]]);
});

// A bound far above a 2 s timeout and far below a fixed 30 s wait: not a speed test, a
// test of which deadline ended the call.
const kBoundMs = 15000;

it('with timeoutMs 2000, a claim with policy fail ends in about 2 s when nothing answers', async () => {
  // A listener that accepts and never speaks HTTP/2, and a port where nothing listens.
  const conns: net.Socket[] = [];
  const silent = net.createServer((c) => conns.push(c));
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
  const closed = net.createServer();
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
  const closedPort = (closed.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => closed.close(() => resolve()));
  try {
    for (const target of [`127.0.0.1:${(silent.address() as net.AddressInfo).port}`, `127.0.0.1:${closedPort}`]) {
      const c = new Client({server: target, timeoutMs: 2000});
      try {
        for (const call of [() => c.claim('p', {policy: 'fail'}), () => c.claimBatch('p', 2, {policy: 'fail'})]) {
          const start = Date.now();
          await assert.rejects(call(), (e: unknown) => e instanceof DeadlineExceeded || e instanceof Unavailable);
          const took = Date.now() - start;
          assert.ok(took < kBoundMs, `${target}: took ${took} ms`);
        }
      } finally {
        c.close();
      }
    }
  } finally {
    for (const c of conns) c.destroy();
    silent.close();
  }
});
