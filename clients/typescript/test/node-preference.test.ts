// The nodePreference claim option.
//
// On the wire, against a fake ClaimService (grpc-js) that keeps the requests it decodes:
// Claim and ClaimBatch carry it as node_preference, apart from labels, and an empty map
// when it is not given.
//
// Against a real sbx-server (--runtime instant), a soft preference: the local runtime
// reports no node labels, so a preference matches no sandbox, and pools whose selection
// policy honours preferences (spread, pack) must still hand out a warm one. Their
// empty_pool_policy is fail, so that a preference wrongly treated as a requirement shows
// at once as PoolExhausted rather than as a wait. A key or value that is not label syntax
// is refused by the server, naming it and the field (which also shows the map reached
// the server as node_preference).
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import assert from 'node:assert/strict';
import path from 'node:path';
import {after, before, describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Client, InvalidArgument} from '@sbx/client';

import {instantConfig, TestServer, waitFor} from './harness.js';

const kProtoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../dist/proto');
const kLoad = {includeDirs: [kProtoDir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true};

// Labels no node has (the local runtime reports none at all).
const kNowhere = {'topology.kubernetes.io/zone': 'nowhere-1', 'kubernetes.io/hostname': 'node-404'};

type Raw = Record<string, unknown>;
type Unary = (request: unknown, options: grpc.CallOptions, done: (err: grpc.ServiceError | null, resp?: Raw) => void) => void;

function v1Of(protos: string[]): grpc.GrpcObject {
  const def = protoLoader.loadSync(protos, kLoad);
  return (grpc.loadPackageDefinition(def).sbx as grpc.GrpcObject).v1 as grpc.GrpcObject;
}

describe('on the wire', () => {
  const seen: {method: string; request: Raw}[] = [];
  let server: grpc.Server;
  let client: Client;

  before(async () => {
    const v1 = v1Of(['sbx/v1/claims.proto']);
    const claim = (id: unknown, pool: unknown) => ({claim_id: id, pool, state: 'CLAIM_STATE_ACTIVE', sandbox: {id: 'sb-1'}});
    server = new grpc.Server();
    server.addService((v1.ClaimService as grpc.ServiceClientConstructor).service, {
      Claim: (call: grpc.ServerUnaryCall<Raw, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        seen.push({method: 'Claim', request: call.request});
        cb(null, {claim: claim(call.request.claim_id, call.request.pool)});
      },
      ClaimBatch: (call: grpc.ServerUnaryCall<Raw, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        seen.push({method: 'ClaimBatch', request: call.request});
        const n = Number(call.request.count);
        cb(null, {batch_id: call.request.batch_id,
                  claims: Array.from({length: n}, (_, i) => claim(`${call.request.batch_id}#${i}`, call.request.pool))});
      },
    });
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
    client = new Client({server: `127.0.0.1:${port}`, retry: {maxAttempts: 1}});
  });

  after(() => {
    client?.close();
    server?.forceShutdown();
  });

  it('Claim and ClaimBatch send nodePreference as node_preference, apart from labels', async () => {
    const zone = {'topology.kubernetes.io/zone': 'europe-west1-b', disk: 'ssd'};
    seen.length = 0;
    await client.claim('p', {nodePreference: zone, labels: {team: 'rl'}});
    await client.claimBatch('p', 2, {nodePreference: zone, labels: {team: 'rl'}});
    assert.deepEqual(seen.map((s) => [s.method, s.request.node_preference, s.request.labels]),
                     [['Claim', zone, {team: 'rl'}], ['ClaimBatch', zone, {team: 'rl'}]]);
  });

  it('sends no preference when none is given', async () => {
    seen.length = 0;
    await client.claim('p');
    await client.claimBatch('p', 1, {labels: {team: 'rl'}});
    assert.deepEqual(seen.map((s) => s.request.node_preference), [{}, {}]);
  });
});

describe('against sbx-server', () => {
  let server: TestServer;
  let client: Client;

  async function warm(pool: string, n: number): Promise<void> {
    await waitFor(`${n} warm sandboxes in pool "${pool}"`,
                  async () => ((await client.pools()).find((p) => p.name === pool)?.status.warm ?? 0) >= n);
  }

  before(async () => {
    server = new TestServer({runtime: 'instant', config: instantConfig([
      {name: 'spread', warm: 2, policy: 'fail', selection: 'spread'},
      {name: 'pack', warm: 2, policy: 'fail', selection: 'pack'},
    ])});
    await server.start();
    client = new Client({server: server.target});
    // The premise of the tests: the pools do select with these policies (the SDK's Pool
    // does not show it, hence a plain AdminService stub).
    const Admin = v1Of(['sbx/v1/admin.proto']).AdminService as grpc.ServiceClientConstructor;
    const admin = new Admin(server.target, grpc.credentials.createInsecure());
    try {
      for (const name of ['spread', 'pack']) {
        const got = await new Promise<Raw>((resolve, reject) => {
          const getPool = (admin as unknown as Record<string, Unary>).GetPool!;
          getPool.call(admin, {name}, {deadline: Date.now() + 10000}, (err, resp) => (err ? reject(err) : resolve(resp!)));
        });
        assert.equal((got.pool as Raw).selection_policy, name, `pool "${name}"'s selection_policy`);
      }
    } finally {
      admin.close();
    }
  });

  after(async () => {
    client?.close();
    await server?.cleanUp();
  });

  for (const pool of ['spread', 'pack']) {
    it(`a ${pool} pool serves a claim and a batch whose preference no node has, from its warm sandboxes`, async () => {
      await warm(pool, 2);
      {
        await using sb = await client.claim(pool, {nodePreference: kNowhere, policy: 'fail'});
        assert.deepEqual([sb.claim!.pool, sb.claim!.state, sb.claim!.launchType], [pool, 'active', 'warm']);
      }
      await warm(pool, 2);
      // All or nothing: both sandboxes, though neither node matches.
      await using group = await client.claimBatch(pool, 2, {nodePreference: kNowhere, policy: 'fail'});
      assert.deepEqual(group.sandboxes.map((s) => [s.claim!.state, s.claim!.launchType]),
                       [['active', 'warm'], ['active', 'warm']]);
    });
  }

  it('pools() reports each pool\'s selection policy (the Python SDK\'s pool shape too)', async () => {
    const pools = Object.fromEntries((await client.pools()).map((p) => [p.name, p]));
    assert.equal(pools.spread!.selectionPolicy, 'spread');
    assert.equal(pools.pack!.selectionPolicy, 'pack');
  });

  it('refuses a key or value that is not label syntax, naming it', async () => {
    const bad: {pref: Record<string, string>; says: string}[] = [
      {pref: {'-zone': 'a'}, says: 'node_preference: label key "-zone"'},
      {pref: {zone: 'a b'}, says: 'node_preference: value "a b" of label "zone"'},
    ];
    for (const {pref, says} of bad) {
      for (const call of [() => client.claim('spread', {nodePreference: pref}),
                          () => client.claimBatch('spread', 1, {nodePreference: pref})]) {
        await assert.rejects(call(), (e: unknown) => {
          assert.ok(e instanceof InvalidArgument, `expected InvalidArgument, got ${e}`);
          assert.ok(e.details.includes(says), `"${e.details}" does not say ${says}`);
          return true;
        });
      }
    }
    assert.deepEqual(await client.listClaims({pool: 'spread', states: ['active']}), []);
  });
});
