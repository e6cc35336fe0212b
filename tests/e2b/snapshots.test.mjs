// Snapshots through sbx's E2B front with the unmodified `e2b` SDK against a real local
// sbx-server: createSnapshot (sbx's CreateSnapshot of the sandbox's workspace),
// listSnapshots (all, by sandbox, by name, paged), deleteSnapshot (true, then false), and
// tenants: bob neither sees nor deletes alice's snapshot; Sandbox.create(snapshotId) and
// sandbox.fork through sbx's Fork.
import assert from 'node:assert/strict';
import http from 'node:http';
import {after, before, test} from 'node:test';
import {setTimeout as sleep} from 'node:timers/promises';

import {Sandbox, SandboxError} from 'e2b';

import {BOB, TestServer, listAll} from './harness.mjs';

// With the port proxy and the E2B domain: a fork's port is reached by getHost too.
const server = new TestServer({extraArgs: ['--proxy_listen=127.0.0.1:0', '--e2b_domain=sbx.localhost']});
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

test('Sandbox.create(snapshotId) starts a sandbox from the snapshot (sbx\'s Fork)', async () => {
  await sbx.files.write('/home/user/from-snapshot.txt', 'taken before the snapshot\n');
  const snap = await sbx.createSnapshot({name: 'to-fork'});
  await sbx.files.write('/home/user/from-snapshot.txt', 'changed after it\n');
  const child = await Sandbox.create(snap.snapshotId, {timeoutMs: 60_000, metadata: {from: 'snapshot'}});
  try {
    // A fork's claim is "<batch>#0"; E2B sees "<batch>-0", a DNS label getHost can use.
    assert.match(child.sandboxId, /^[0-9a-f]{32}-0$/);
    assert.equal(await child.files.read('/home/user/from-snapshot.txt'), 'taken before the snapshot\n');
    assert.equal((await child.commands.run('cat from-snapshot.txt')).stdout, 'taken before the snapshot\n');
    const info = await child.getInfo();
    assert.equal(info.sandboxId, child.sandboxId);
    assert.deepEqual(info.metadata, {from: 'snapshot'});
    assert.ok((await listAll(Sandbox.list())).some((s) => s.sandboxId === child.sandboxId));
    // Its ports, by getHost (PORT-<batch>-0.DOMAIN), resolved to the E2B listener here.
    await child.commands.run('exec python3 -m http.server 8000 --bind 127.0.0.1', {background: true});
    const get = () => new Promise((resolve, reject) => {
      const req = http.request(`http://${child.getHost(8000)}:${server.e2bPort}/from-snapshot.txt`, {
        agent: false, headers: {'X-Access-Token': child.envdAccessToken},
        lookup: (h, o, cb) => (o && o.all ? cb(null, [{address: '127.0.0.1', family: 4}]) : cb(null, '127.0.0.1', 4)),
      }, (res) => {
        let body = '';
        res.on('data', (d) => { body += d; });
        res.on('end', () => resolve({status: res.statusCode, body}));
      });
      req.on('error', reject);
      req.end();
    });
    const deadline = Date.now() + 20_000;
    let page = await get();
    while (page.status !== 200 && Date.now() < deadline) {
      await sleep(100);
      page = await get();
    }
    assert.equal(page.status, 200, page.body);
    assert.equal(page.body, 'taken before the snapshot\n');
    // Writes of the fork stay its own.
    await child.files.write('/home/user/from-snapshot.txt', 'the fork\'s\n');
    assert.equal(await sbx.files.read('/home/user/from-snapshot.txt'), 'changed after it\n');
    // A snapshot with a live fork cannot be deleted (sbx keeps its fork pool): a 409.
    await assert.rejects(Sandbox.deleteSnapshot(snap.snapshotId), (e) => e instanceof SandboxError);
  } finally {
    assert.equal(await child.kill(), true);
  }
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
});

test('sandbox.fork: count forks of a running sandbox, each with its files', async () => {
  await sbx.files.write('/home/user/forked.txt', 'state at the fork\n');
  const before = new Set((await listAll(Sandbox.listSnapshots())).map((s) => s.snapshotId));
  const forks = await sbx.fork({count: 2, timeoutMs: 60_000});
  try {
    assert.equal(forks.length, 2);
    const ids = forks.map((f) => f.sandboxId);
    assert.equal(new Set(ids).size, 2);
    for (const f of forks) {
      assert.ok(!(f instanceof Error), String(f));
      assert.match(f.sandboxId, /^[0-9a-f]{32}-[01]$/);
      assert.equal(await f.files.read('/home/user/forked.txt'), 'state at the fork\n');
    }
    // The source runs on.
    assert.equal((await sbx.commands.run('cat forked.txt')).stdout, 'state at the fork\n');
    // Bob cannot fork alice's sandbox.
    await assert.rejects(Sandbox.fork(sbx.sandboxId, {apiKey: BOB}), (e) => e.name === 'SandboxNotFoundError');
  } finally {
    for (const f of forks) if (!(f instanceof Error)) await f.kill();
  }
  // sbx's Fork of a sandbox keeps the snapshot it took (and counts it): it is listed, and
  // can be deleted once its forks are gone.
  const made = (await listAll(sbx.listSnapshots())).filter((s) => !before.has(s.snapshotId));
  assert.equal(made.length, 1);
  assert.equal(await Sandbox.deleteSnapshot(made[0].snapshotId), true);
});
