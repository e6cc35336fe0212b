// Which calls the SDK retries, against a fake sbx.v1 server (grpc-js) whose answers the
// test scripts: UNAVAILABLE and ABORTED are retried for idempotent calls with the same
// request (claim id included), other codes and non-idempotent calls are not, retries stop
// at the deadline, and RESOURCE_EXHAUSTED's trailer becomes PoolExhausted.retryAfterMs.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import assert from 'node:assert/strict';
import path from 'node:path';
import {after, before, beforeEach, it} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Aborted, Client, DeadlineExceeded, InvalidArgument, PoolExhausted, Unavailable} from '@sbx/client';

const kProtoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../dist/proto');

// Codes the fake answers, in order, before it answers OK; and the requests it saw.
let script: {code: grpc.status; trailer?: string}[] = [];
let seen: {method: string; request: Record<string, unknown>; token?: string}[] = [];
let deadlineAttempts = 0;
let server: grpc.Server;
let client: Client;

function handler(method: string, ok: () => unknown) {
  return (call: grpc.ServerUnaryCall<Record<string, unknown>, unknown>, cb: grpc.sendUnaryData<unknown>) => {
    const auth = call.metadata.get('authorization')[0];
    if (auth === 'Bearer deadline') {
      // The deadline test's calls, kept apart: its last attempt may reach this server after
      // that test ended (the deadline fell inside it) and must not touch another's script.
      deadlineAttempts++;
      cb({code: grpc.status.ABORTED, details: 'scripted ABORTED', metadata: new grpc.Metadata()});
      return;
    }
    seen.push({method, request: call.request, token: typeof auth === 'string' ? auth : undefined});
    const next = script.shift();
    if (next) {
      const metadata = new grpc.Metadata();
      if (next.trailer) metadata.set('sbx-retry-after-ms', next.trailer);
      cb({code: next.code, details: `scripted ${grpc.status[next.code]}`, metadata});
    } else {
      cb(null, ok());
    }
  };
}

before(async () => {
  const def = protoLoader.loadSync(['sbx/v1/claims.proto', 'sbx/v1/diagnostics.proto', 'sbx/v1/sandboxes.proto'],
                                   {includeDirs: [kProtoDir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true});
  const v1 = (grpc.loadPackageDefinition(def).sbx as grpc.GrpcObject).v1 as grpc.GrpcObject;
  const claim = (req: Record<string, unknown>) => ({claim_id: req.claim_id, pool: req.pool, state: 'CLAIM_STATE_ACTIVE', sandbox: {id: 'sb-1'}});
  server = new grpc.Server();
  server.addService((v1.DiagnosticsService as grpc.ServiceClientConstructor).service, {
    Ping: handler('Ping', () => ({server_version: 'fake'})),
  });
  server.addService((v1.ClaimService as grpc.ServiceClientConstructor).service, {
    Claim: (call: grpc.ServerUnaryCall<Record<string, unknown>, unknown>, cb: grpc.sendUnaryData<unknown>) =>
      handler('Claim', () => ({claim: claim(call.request), replayed: seen.length > 1}))(call, cb),
    Release: (call: grpc.ServerUnaryCall<Record<string, unknown>, unknown>, cb: grpc.sendUnaryData<unknown>) =>
      handler('Release', () => ({claim: {...claim(call.request), state: 'CLAIM_STATE_RELEASED'}}))(call, cb),
  });
  server.addService((v1.SandboxService as grpc.ServiceClientConstructor).service, {
    WriteFile: handler('WriteFile', () => ({size: '1'})),
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  client = new Client({server: `127.0.0.1:${port}`, retry: {initialBackoffMs: 5, maxBackoffMs: 20}});
});

after(() => {
  client?.close();
  server?.forceShutdown();
});

beforeEach(() => {
  script = [];
  seen = [];
});

it('Claim is retried after UNAVAILABLE and ABORTED with the same claim id', async () => {
  script = [{code: grpc.status.UNAVAILABLE}, {code: grpc.status.ABORTED}, {code: grpc.status.UNAVAILABLE}];
  const sb = await client.claim('p', {ttl: '1m'});
  assert.equal(seen.length, 4);
  const ids = new Set(seen.map((s) => s.request.claim_id));
  assert.equal(ids.size, 1);
  assert.equal(sb.claimId, [...ids][0]);
  assert.match(sb.claimId, /^[0-9a-f-]{36}$/);
  assert.equal(sb.replayed, true);
});

it('other codes are not retried', async () => {
  script = [{code: grpc.status.INVALID_ARGUMENT}];
  await assert.rejects(client.claim('p'), InvalidArgument);
  assert.equal(seen.length, 1);
  script = [{code: grpc.status.RESOURCE_EXHAUSTED, trailer: '1500'}];
  const e = await client.claim('p').catch((e: unknown) => e);
  assert.ok(e instanceof PoolExhausted);
  assert.equal(e.retryAfterMs, 1500);
  assert.equal(e.details, 'scripted RESOURCE_EXHAUSTED');
  assert.equal(seen.length, 2);
  script = [{code: grpc.status.RESOURCE_EXHAUSTED}];
  const noHint = await client.claim('p').catch((e: unknown) => e);
  assert.ok(noHint instanceof PoolExhausted);
  assert.equal(noHint.retryAfterMs, undefined);
});

it('an appending WriteFile is not retried; a replacing one is', async () => {
  const sb = client.sandbox('c1');
  script = [{code: grpc.status.UNAVAILABLE}];
  await assert.rejects(sb.files.write('f', 'x', {append: true}), Unavailable);
  assert.equal(seen.length, 1);
  script = [{code: grpc.status.UNAVAILABLE}];
  assert.equal(await sb.files.write('f', 'x'), 1);
  assert.equal(seen.length, 3);
});

it('retries stop at the deadline with the last error', async () => {
  // Every call with this token is answered ABORTED (see handler).
  const d = new Client({server: client.server, token: 'deadline', retry: {initialBackoffMs: 5, maxBackoffMs: 20}});
  try {
    deadlineAttempts = 0;
    const e = await d.ping({timeoutMs: 300}).catch((e: unknown) => e);
    // The last error is the scripted ABORTED, or DEADLINE_EXCEEDED when the deadline fell
    // inside the last attempt (a full suite on two cores once made that attempt late).
    assert.ok(e instanceof Aborted || e instanceof DeadlineExceeded, `got ${e}`);
    assert.ok(deadlineAttempts > 1 && deadlineAttempts < 100000, `${deadlineAttempts} attempts`);
  } finally {
    d.close();
  }
});

it('maxAttempts bounds the attempts; release is retried', async () => {
  const c = new Client({server: client.server, retry: {maxAttempts: 2, initialBackoffMs: 1}});
  try {
    script = [{code: grpc.status.UNAVAILABLE}, {code: grpc.status.UNAVAILABLE}, {code: grpc.status.UNAVAILABLE}];
    await assert.rejects(c.ping(), Unavailable);
    assert.equal(seen.length, 2);
  } finally {
    c.close();
  }
  script = [{code: grpc.status.UNAVAILABLE}];
  seen = [];
  assert.equal((await client.release('c9')).state, 'released');
  assert.equal(seen.length, 2);
});
