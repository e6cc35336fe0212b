// Snapshots through sbx's E2B front with the unmodified `e2b` SDK against a real local
// sbx-server: createSnapshot (sbx's CreateSnapshot of the sandbox's workspace),
// listSnapshots (all, by sandbox, by name, paged), deleteSnapshot (true, then false), and
// tenants: bob neither sees nor deletes alice's snapshot. Sandbox.create(snapshotId) needs
// sbx's Fork: until this server has it, a 501 naming it.
import assert from 'node:assert/strict';
import {after, before, test} from 'node:test';

import {Sandbox, SandboxError} from 'e2b';

import {BOB, TestServer, listAll} from './harness.mjs';

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

test('createSnapshot, listSnapshots, deleteSnapshot', async () => {
  await sbx.files.write('/home/user/kept.txt', 'in the snapshot\n');
  const snap = await sbx.createSnapshot({name: 'first'});
  assert.match(snap.snapshotId, /^sn-[a-z0-9]{16}$/);
  assert.deepEqual(snap.names, ['first']);
  const other = await Sandbox.createSnapshot(sbx.sandboxId);  // static, without a name
  assert.deepEqual(other.names, []);

  // The sandbox runs on after it (frozen only while the copy is made).
  assert.equal((await sbx.commands.run('cat kept.txt')).stdout, 'in the snapshot\n');

  const ids = (items) => items.map((s) => s.snapshotId);
  assert.deepEqual(ids(await listAll(Sandbox.listSnapshots())), [snap.snapshotId, other.snapshotId]);
  assert.deepEqual(ids(await listAll(sbx.listSnapshots())), [snap.snapshotId, other.snapshotId]);
  assert.deepEqual(ids(await listAll(Sandbox.listSnapshots({name: 'first'}))), [snap.snapshotId]);
  // Pages of one, chained by X-Next-Token.
  const pager = Sandbox.listSnapshots({limit: 1});
  assert.deepEqual(ids(await pager.nextItems()), [snap.snapshotId]);
  assert.equal(pager.hasNext, true);
  assert.deepEqual(ids(await pager.nextItems()), [other.snapshotId]);
  assert.equal(pager.hasNext, false);

  // Another sandbox's snapshots are not this one's.
  const second = await Sandbox.create('default', {timeoutMs: 60_000});
  try {
    assert.deepEqual(ids(await listAll(second.listSnapshots())), []);
  } finally {
    await second.kill();
  }

  assert.equal(await Sandbox.deleteSnapshot(other.snapshotId), true);
  assert.equal(await Sandbox.deleteSnapshot(other.snapshotId), false);
  assert.deepEqual(ids(await listAll(Sandbox.listSnapshots())), [snap.snapshotId]);
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
  assert.deepEqual(ids(await listAll(Sandbox.listSnapshots())), []);
});

test('a snapshot of a sandbox that is not the caller\'s, or none, is SandboxNotFoundError', async () => {
  await assert.rejects(Sandbox.createSnapshot(sbx.sandboxId, {apiKey: BOB}), (e) => e.name === 'SandboxNotFoundError');
  await assert.rejects(Sandbox.createSnapshot('0'.repeat(32)), (e) => e.name === 'SandboxNotFoundError');
});

test('tenants: bob neither sees nor deletes alice\'s snapshot', async () => {
  const snap = await sbx.createSnapshot({name: 'alices'});
  try {
    assert.deepEqual(await listAll(Sandbox.listSnapshots({apiKey: BOB})), []);
    assert.deepEqual(await listAll(Sandbox.listSnapshots({apiKey: BOB, sandboxId: sbx.sandboxId})), []);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, {apiKey: BOB}), false);
    await assert.rejects(Sandbox.create(snap.snapshotId, {apiKey: BOB, timeoutMs: 60_000}),
                         (e) => e instanceof SandboxError && /not found/i.test(e.message));
    assert.deepEqual((await listAll(Sandbox.listSnapshots())).map((s) => s.snapshotId), [snap.snapshotId]);
  } finally {
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
  }
});

test('Sandbox.create(snapshotId) without sbx\'s Fork is a 501 naming it', async () => {
  const snap = await sbx.createSnapshot();
  try {
    await assert.rejects(Sandbox.create(snap.snapshotId, {timeoutMs: 60_000}),
                         (e) => e instanceof SandboxError && /Fork/.test(e.message));
  } finally {
    await Sandbox.deleteSnapshot(snap.snapshotId);
  }
});
