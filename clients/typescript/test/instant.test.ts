// The SDK against a real sbx-server whose sandboxes are only names (--runtime instant),
// with authentication: a typed error for each status code the server sends, PoolExhausted
// with its retry hint, AbortSignal on a waiting claim, 200 concurrent claims.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';

import {
  AlreadyExists, Cancelled, Client, DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound,
  PermissionDenied, PoolExhausted, SbxError, Unauthenticated, Unavailable,
} from '@sbx/client';

import {instantConfig, TestServer, waitFor} from './harness.js';

let server: TestServer;
let admin: Client;
let tenant: Client;

before(async () => {
  server = new TestServer({
    runtime: 'instant',
    config: instantConfig([
      {name: 'warm', warm: 260, maxTtl: '1h'},
      {name: 'other', warm: 2},
      // Never holds a sandbox: claims wait (and time out) or fail at once.
      {name: 'empty', warm: 0},
      {name: 'empty-fail', warm: 0, policy: 'fail'},
    ]),
    tokens: ['admin-token ops admin', 'tenant-token team-a'],
  });
  await server.start();
  admin = new Client({server: server.target, token: 'admin-token'});
  tenant = new Client({server: server.target, token: 'tenant-token'});
  await waitFor('260 warm sandboxes', async () => (await admin.pools()).find((p) => p.name === 'warm')!.status.warm >= 260);
});

after(async () => {
  admin?.close();
  tenant?.close();
  await server?.cleanUp();
});

async function errorOf(p: Promise<unknown>): Promise<SbxError> {
  const e = await p.then(() => undefined, (e: unknown) => e);
  assert.ok(e instanceof SbxError, `expected an SbxError, got ${e}`);
  return e;
}

describe('typed errors', () => {
  it('UNAUTHENTICATED without or with a wrong token', async () => {
    const anon = new Client({server: server.target, token: ''});
    const wrong = new Client({server: server.target, token: 'nope'});
    try {
      const e = await errorOf(anon.claim('warm'));
      assert.ok(e instanceof Unauthenticated);
      assert.equal(e.code, 'UNAUTHENTICATED');
      assert.ok(e.details.length > 0);
      assert.ok(await errorOf(wrong.listClaims()) instanceof Unauthenticated);
      assert.match((await anon.ping()).serverVersion, /\d/);  // Ping needs no token
    } finally {
      anon.close();
      wrong.close();
    }
  });

  it('the token comes from $SBX_TOKEN and the server from $SBX_SERVER', async () => {
    const saved = {server: process.env.SBX_SERVER, token: process.env.SBX_TOKEN};
    process.env.SBX_SERVER = server.target;
    process.env.SBX_TOKEN = 'tenant-token';
    const c = new Client();
    try {
      assert.equal(c.server, server.target);
      await using sb = await c.claim('warm');
      assert.equal(sb.claim?.owner, 'team-a');
    } finally {
      c.close();
      for (const [k, v] of [['SBX_SERVER', saved.server], ['SBX_TOKEN', saved.token]] as const) {
        if (v === undefined) delete process.env[k]; else process.env[k] = v;
      }
    }
  });

  it('PERMISSION_DENIED: a tenant listing pools or another owner\'s claims', async () => {
    const e = await errorOf(tenant.pools());
    assert.ok(e instanceof PermissionDenied);
    assert.ok(await errorOf(tenant.listClaims({owner: 'ops'})) instanceof PermissionDenied);
  });

  it('NOT_FOUND: a missing pool, claim, or another tenant\'s claim, with the server\'s message', async () => {
    const e = await errorOf(tenant.claim('no-such-pool'));
    assert.ok(e instanceof NotFound);
    assert.match(e.message, /no-such-pool/);
    assert.ok(await errorOf(tenant.getClaim('missing')) instanceof NotFound);
    await using mine = await admin.claim('warm');
    assert.ok(await errorOf(tenant.getClaim(mine.claimId)) instanceof NotFound);
    assert.ok(await errorOf(tenant.release(mine.claimId)) instanceof NotFound);
  });

  it('INVALID_ARGUMENT: a bad id, a ttl above max_ttl, a malformed duration', async () => {
    assert.ok(await errorOf(tenant.claim('warm', {id: 'bad id!'})) instanceof InvalidArgument);
    const e = await errorOf(tenant.claim('warm', {ttl: '2h'}));
    assert.ok(e instanceof InvalidArgument);
    assert.match(e.details, /ttl/);
    assert.ok(await errorOf(tenant.claim('warm', {ttl: 'ten minutes'})) instanceof InvalidArgument);
  });

  it('ALREADY_EXISTS: a claim id reused for another pool', async () => {
    await using sb = await tenant.claim('warm', {id: `reuse-${process.pid}`});
    assert.ok(await errorOf(tenant.claim('other', {id: sb.claimId})) instanceof AlreadyExists);
    // The same pool is a replay of the same claim.
    const again = await tenant.claim('warm', {id: sb.claimId});
    assert.equal(again.replayed, true);
    assert.equal(again.sandboxId, sb.sandboxId);
  });

  it('FAILED_PRECONDITION: the id of an ended claim', async () => {
    const sb = await tenant.claim('warm');
    await sb.release();
    assert.ok(await errorOf(tenant.claim('warm', {id: sb.claimId})) instanceof FailedPrecondition);
    assert.ok(await errorOf(sb.renew('1m')) instanceof FailedPrecondition);
  });

  it('RESOURCE_EXHAUSTED is PoolExhausted with the retry hint', async () => {
    const e = await errorOf(tenant.claim('empty-fail'));
    assert.ok(e instanceof PoolExhausted, `got ${e.name}`);
    assert.equal(e.code, 'RESOURCE_EXHAUSTED');
    assert.equal(typeof (e as PoolExhausted).retryAfterMs, 'number');
    const b = await errorOf(tenant.claimBatch('empty-fail', 2));
    assert.ok(b instanceof PoolExhausted, `got ${b.name}`);
    assert.equal(typeof (b as PoolExhausted).retryAfterMs, 'number');
    // A batch on a WAIT pool waits instead, and holds nothing at its deadline.
    const w = await errorOf(tenant.claimBatch('empty', 2, {wait: '200ms'}));
    assert.ok(w instanceof DeadlineExceeded, `got ${w.name}: ${w.message}`);
    // policy given by the claim
    assert.ok(await errorOf(tenant.claim('empty', {policy: 'fail'})) instanceof PoolExhausted);
  });

  it('DEADLINE_EXCEEDED: no sandbox within the wait; nothing is held', async () => {
    const e = await errorOf(tenant.claim('empty', {wait: '200ms', id: `dl-${process.pid}`}));
    assert.ok(e instanceof DeadlineExceeded, `got ${e.name}: ${e.message}`);
    assert.deepEqual(await tenant.listClaims({pool: 'empty'}), []);
  });

  it('UNAVAILABLE: retries stop at the deadline', async () => {
    // A port nothing listens on: the server's own, after it is gone, is not reusable
    // here, so take a fresh one from a closed socket.
    const net = await import('node:net');
    const port = await new Promise<number>((resolve) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const p = (s.address() as {port: number}).port;
        s.close(() => resolve(p));
      });
    });
    const c = new Client({server: `127.0.0.1:${port}`, timeoutMs: 1000});
    try {
      const e = await errorOf(c.ping());
      // The last attempt may be the one the deadline cuts short.
      assert.ok(e instanceof Unavailable || e instanceof DeadlineExceeded, `got ${e.name}: ${e.message}`);
    } finally {
      c.close();
    }
  });
});

describe('cancellation', () => {
  it('an AbortSignal cancels a waiting claim, which holds nothing afterwards', async () => {
    const ac = new AbortController();
    const id = `abort-${process.pid}`;
    const p = tenant.claim('empty', {wait: '60s', id, signal: ac.signal});
    await waitFor('the claim to wait', async () => (await admin.pools()).find((x) => x.name === 'empty')!.status.waitingClaims === 1);
    ac.abort();
    const e = await errorOf(p);
    assert.ok(e instanceof Cancelled, `got ${e.name}`);
    // Nothing was granted. (This server keeps a cancelled claim in the pool's wait queue
    // until its wait passes: waitingClaims stays 1 meanwhile; see docs/sdk-typescript.md.)
    assert.ok(await errorOf(tenant.getClaim(id)) instanceof NotFound);
  });

  it('a signal aborted before the call rejects at once', async () => {
    const e = await errorOf(tenant.claim('warm', {signal: AbortSignal.abort()}));
    assert.ok(e instanceof Cancelled);
    assert.deepEqual(await tenant.listClaims({states: ['active']}), []);
  });
});

describe('concurrency', () => {
  it('200 concurrent claims get 200 distinct sandboxes, all released', async () => {
    const sandboxes = await Promise.all(Array.from({length: 200}, (_, i) =>
      tenant.claim('warm', {labels: {run: 'c200'}, id: `c200-${process.pid}-${i}`})));
    try {
      assert.equal(new Set(sandboxes.map((s) => s.sandboxId)).size, 200);
      assert.equal((await tenant.listClaims({selector: 'run=c200', states: ['active']})).length, 200);
    } finally {
      await Promise.all(sandboxes.map((s) => s.release()));
    }
    assert.equal((await tenant.listClaims({selector: 'run=c200', states: ['active']})).length, 0);
    assert.equal((await tenant.listClaims({selector: 'run=c200', states: ['released']})).length, 200);
  });

  it('best-effort batches and batch replays', async () => {
    const id = `be-${process.pid}`;
    const g = await tenant.claimBatch('other', 5, {bestEffort: true, id});
    try {
      assert.ok(g.length >= 1 && g.length <= 2, `got ${g.length}`);
      const again = await tenant.claimBatch('other', 5, {bestEffort: true, id});
      assert.equal(again.replayed, true);
      assert.deepEqual(again.sandboxes.map((s) => s.claimId), g.sandboxes.map((s) => s.claimId));
    } finally {
      await g.release();
    }
    for (const s of g) assert.equal((await tenant.getClaim(s.claimId)).state, 'released');
  });
});
