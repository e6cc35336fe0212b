// Claim priority against a real sbx-server (--runtime instant): one tenant's claims
// queued in an empty pool are served interactive first, then normal (also when none is
// given), then batch, whatever order they came in; and a priority that is none of them is
// rejected before any call, naming it.
//
// Deterministic, with no timing: the pool has max_warm 0, so claims queue and nothing
// serves them; each claim is sent once the pool reports the previous ones as waiting (the
// queue's order is then the sending order); then AdminService.ScalePool lifts max_warm to
// 1 (the SDK has no admin calls, hence a plain grpc-js stub). The refill then makes one
// sandbox at a time: it counts a sandbox as being created until its hand-over to the first
// waiter has reserved the claim's revision, so the next one cannot start before. The
// grants' revisions, the server's single increasing sequence, give the order of service.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import assert from 'node:assert/strict';
import path from 'node:path';
import {after, before, it} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Client, InvalidArgument, type ClaimPriority} from '@sbx/client';

import {instantConfig, TestServer, waitFor} from './harness.js';

const kProtoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../dist/proto');
// Each claim's wait: far beyond what the test needs, so that none times out.
const kWait = '60s';

type Unary = (request: unknown, options: grpc.CallOptions, done: (err: grpc.ServiceError | null) => void) => void;

let server: TestServer;
let client: Client;
let admin: grpc.Client;

before(async () => {
  server = new TestServer({runtime: 'instant', config: instantConfig([{name: 'prio', warm: 0, wait: kWait}])});
  await server.start();
  client = new Client({server: server.target});
  const def = protoLoader.loadSync(['sbx/v1/admin.proto'],
                                   {includeDirs: [kProtoDir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true});
  const v1 = (grpc.loadPackageDefinition(def).sbx as grpc.GrpcObject).v1 as grpc.GrpcObject;
  const Admin = v1.AdminService as grpc.ServiceClientConstructor;
  admin = new Admin(server.target, grpc.credentials.createInsecure());
});

after(async () => {
  admin?.close();
  client?.close();
  await server?.cleanUp();
});

function scaleToOne(pool: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const scale = (admin as unknown as Record<string, Unary>).ScalePool!;
    scale.call(admin, {name: pool, max_warm: {value: 1}}, {deadline: Date.now() + 10000},
               (err) => (err ? reject(err) : resolve()));
  });
}

async function waiting(pool: string, n: number): Promise<void> {
  await waitFor(`${n} claims waiting in pool "${pool}"`,
                async () => (await client.pools()).find((p) => p.name === pool)?.status.waitingClaims === n);
}

it('serves an interactive ClaimBatch, then a normal claim, then a batch one, queued in reverse', async () => {
  const background = client.claim('prio', {wait: kWait, priority: 'batch'});
  await waiting('prio', 1);
  const normal = client.claim('prio', {wait: kWait});  // no priority: normal
  await waiting('prio', 2);
  const urgent = client.claimBatch('prio', 1, {wait: kWait, priority: 'interactive'});
  await waiting('prio', 3);
  await scaleToOne('prio');
  const [group, n, b] = await Promise.all([urgent, normal, background]);
  try {
    const served = [['interactive batch', group.sandboxes[0]!.claim!.revision],
                    ['normal', n.claim!.revision], ['batch', b.claim!.revision]] as const;
    const order = [...served].sort((x, y) => x[1] - y[1]).map(([name]) => name);
    assert.deepEqual(order, ['interactive batch', 'normal', 'batch'], JSON.stringify(served));
  } finally {
    await Promise.all([group.release(), n.release(), b.release()]);
  }
});

it('rejects a priority that is not interactive, normal or batch, naming it, before any call', async () => {
  // Nothing listens there: the check must come first.
  const offline = new Client({server: '127.0.0.1:1', retry: {maxAttempts: 1}});
  try {
    const bad = 'urgent' as ClaimPriority;  // what plain JavaScript could pass
    for (const call of [() => offline.claim('prio', {priority: bad}), () => offline.claimBatch('prio', 2, {priority: bad})]) {
      await assert.rejects(call(), (e: unknown) => {
        assert.ok(e instanceof InvalidArgument, `expected InvalidArgument, got ${e}`);
        assert.equal(e.details, 'priority "urgent" is not one of "interactive", "normal", "batch"');
        return true;
      });
    }
  } finally {
    offline.close();
  }
});
