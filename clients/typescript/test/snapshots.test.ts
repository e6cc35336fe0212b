// Snapshots, reset and fork (issue 37): `sb.snapshot()`, `sb.reset(snap)`,
// `client.fork(snap, n)`, `client.snapshots.list/get/delete`.
//
// On the wire, against a fake Snapshots service (grpc-js): a Fork whose first attempt
// answers UNAVAILABLE is retried with the same batch id, made by the SDK when the caller
// gives none; the source is sent as snapshot_id or claim_id.
//
// Against a real sbx-server (root: local runtime, bubblewrap, a pool of a busybox image
// built here offline by tests/images/test_images.py, two tenants): snapshot -> write ->
// reset brings the files back; forks of a snapshot start at its files and write only their
// own; a fork of a live sandbox; list/get/delete; tenant B gets NotFound for A's snapshot
// on get, reset, fork and delete.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {after, before, describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Client, InvalidArgument, NotFound, Sandbox, type Snapshot} from '@sbx/client';

import {TestServer} from './harness.js';

const kHere = path.dirname(fileURLToPath(import.meta.url));
const kProtoDir = path.resolve(kHere, '../../dist/proto');
// dist-test/test -> the repository's tests/images.
const kTestImages = path.resolve(kHere, '../../../../tests/images');
const kLoad = {includeDirs: [kProtoDir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true};
const WS = '/run/sbx/workspace';

type Raw = Record<string, unknown>;

describe('fork on the wire', () => {
  const forks: Raw[] = [];
  let server: grpc.Server;
  let client: Client;

  before(async () => {
    const def = protoLoader.loadSync(['sbx/v1/snapshots.proto'], kLoad);
    const v1 = (grpc.loadPackageDefinition(def).sbx as grpc.GrpcObject).v1 as grpc.GrpcObject;
    server = new grpc.Server();
    server.addService((v1.Snapshots as grpc.ServiceClientConstructor).service, {
      Fork: (call: grpc.ServerUnaryCall<Raw, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        forks.push(call.request);
        if (forks.length % 2 === 1) {
          cb({code: grpc.status.UNAVAILABLE, details: 'the answer was lost'} as grpc.ServiceError);
          return;
        }
        const b = call.request.batch_id as string;
        cb(null, {snapshot_id: call.request.snapshot_id || 'sn-0123456789abcdef', batch_id: b, replayed: true,
                  claims: Array.from({length: Number(call.request.count)}, (_, i) => ({claim_id: `${b}#${i}`, sandbox: {id: `s${i}`}}))});
      },
    });
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
    client = new Client({server: `127.0.0.1:${port}`, retry: {initialBackoffMs: 1, maxBackoffMs: 2}});
  });

  after(() => {
    client?.close();
    server?.forceShutdown();
  });

  it('retries a Fork with the batch id it made', async () => {
    forks.length = 0;
    const group = await client.fork('sn-aaaaaaaaaaaaaaaa', 3, {labels: {a: 'b'}, ttl: '10m'});
    assert.equal(forks.length, 2);
    assert.ok(forks[0].batch_id, 'the SDK makes the batch id');
    assert.equal(forks[1].batch_id, forks[0].batch_id);
    assert.equal(group.batchId, forks[0].batch_id);
    assert.equal(group.snapshotId, 'sn-aaaaaaaaaaaaaaaa');
    assert.equal(group.length, 3);
    assert.deepEqual(forks[1].labels, {a: 'b'});
    assert.equal(forks[1].count, 3);
    assert.equal(forks[1].claim_id, '');
  });

  it('sends a sandbox as claim_id and the caller\'s batch id', async () => {
    forks.length = 0;
    await client.fork(client.sandbox('c-1'), 1, {id: 'mine'});
    assert.deepEqual(forks.map((f) => [f.claim_id, f.snapshot_id, f.batch_id]), [['c-1', '', 'mine'], ['c-1', '', 'mine']]);
  });

  it('refuses a bad source or count before any call', async () => {
    forks.length = 0;
    await assert.rejects(client.fork('', 1), InvalidArgument);
    await assert.rejects(client.fork({} as Snapshot, 1), InvalidArgument);
    await assert.rejects(client.fork('sn-x', 1.5), (e: unknown) => e instanceof InvalidArgument && /count/.test(e.message));
    assert.deepEqual(forks, []);
  });
});

describe('against sbx-server', () => {
  let server: TestServer;
  let a: Client;
  let b: Client;
  let images: string;
  let config: string;

  before(async () => {
    images = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-ts-img-'));
    fs.chmodSync(images, 0o755);
    const script = [
      'import sys', `sys.path.insert(0, ${JSON.stringify(kTestImages)})`, 'import test_images',
      `print(test_images.busybox_image(${JSON.stringify(path.join(images, 'ts'))}, "v1", config={"Env": ["PATH=/bin"]}))`,
    ].join('\n');
    const ref = execFileSync('/usr/bin/python3', ['-c', script], {encoding: 'utf8'}).trim();
    config = path.join(images, 'config.yaml');
    fs.writeFileSync(config, `
templates:
  - name: img
    runtime: local
    local: {image: "${ref}", network: false, workspace_size_bytes: 268435456, layer_size_bytes: 268435456}
pools:
  - {name: img, template: img, min_warm: 2, max_warm: 4, empty_pool_policy: wait, default_wait: 60s}
`);
    process.env.SBX_TEST_CONFIG = config;
    server = new TestServer({
      runtime: 'local', tokens: ['token-a tenant-a', 'token-b tenant-b'],
      extraArgs: ['--image_cache_bytes=1000000000', `--image_import_dir=${images}`],
    });
    fs.chmodSync(server.dir, 0o755);  // image sandboxes run as uids of their own, below it
    await server.start();
    a = new Client({server: server.target, token: 'token-a', timeoutMs: 60000});
    b = new Client({server: server.target, token: 'token-b', timeoutMs: 60000});
  });

  after(async () => {
    a?.close();
    b?.close();
    await server?.cleanUp();
    fs.rmSync(images, {recursive: true, force: true});
  });

  it('snapshot, write, reset: the files are back', async () => {
    let snap: Snapshot;
    {
      await using sb = await a.claim('img');
      assert.equal((await sb.exec('mkdir -p /opt && echo app > /opt/f && echo prepared > state')).exitCode, 0);
      snap = await sb.snapshot({name: 'prepared', labels: {env: 'ts'}});
      assert.match(snap.id, /^sn-[a-z0-9]{16}$/);
      assert.equal(snap.name, 'prepared');
      assert.deepEqual(snap.labels, {env: 'ts'});
      assert.equal(snap.sourceClaimId, sb.claimId);
      assert.match(snap.parentImageDigest, /^sha256:/);
      assert.ok(snap.sizeBytes > 0);
      assert.ok(snap.createdAt instanceof Date);
      await sb.files.write('state', 'dirty\n');
      assert.equal((await sb.exec('rm /opt/f && echo new > /new')).exitCode, 0);
      await sb.reset(snap);
      assert.equal(await sb.files.readText('state'), 'prepared\n');
      const r = await sb.exec('cat /opt/f; test -e /new || echo no-new');
      assert.equal(r.stdout, 'app\nno-new\n');
      await sb.files.write('state', 'dirty again\n');
      await sb.reset(snap.id);
      assert.equal(await sb.files.readText('state'), 'prepared\n');
    }
    await a.snapshots.delete(snap);
  });

  it('forks of a snapshot start at its files and write only their own', async () => {
    await using sb = await a.claim('img');
    await sb.files.write('state', 'prepared\n');
    const snap = await sb.snapshot();
    {
      await using forks = await a.fork(snap, 4, {labels: {episode: '1'}, env: {LATE: 'yes'}, ttl: '10m'});
      assert.equal(forks.length, 4);
      assert.equal(forks.snapshotId, snap.id);
      assert.equal(new Set([...forks].map((f) => f.sandboxId)).size, 4);
      let i = 0;
      for (const f of forks) {
        assert.ok(f instanceof Sandbox);
        assert.equal(f.claimId, `${forks.batchId}#${i}`);
        assert.deepEqual(f.claim?.labels, {episode: '1'});
        assert.equal((await f.exec(`cat ${WS}/state; echo LATE=$LATE`)).stdout, 'prepared\nLATE=yes\n');
        await f.files.write('state', `fork ${i}\n`);
        i++;
      }
      i = 0;
      for (const f of forks) assert.equal(await f.files.readText('state'), `fork ${i++}\n`);
      assert.equal(await sb.files.readText('state'), 'prepared\n');
    }
    await a.snapshots.delete(snap);
  });

  it('forks a live sandbox, snapshotting it first', async () => {
    await using sb = await a.claim('img');
    await sb.files.write('state', 'live\n');
    const before = new Set((await a.snapshots.list()).map((s) => s.id));
    let snapshotId: string;
    {
      await using forks = await a.fork(sb, 2);
      snapshotId = forks.snapshotId;
      const made = (await a.snapshots.list()).map((s) => s.id).filter((id) => !before.has(id));
      assert.deepEqual(made, [snapshotId]);
      assert.equal((await a.snapshots.get(snapshotId)).sourceClaimId, sb.claimId);
      for (const f of forks) assert.equal(await f.files.readText('state'), 'live\n');
    }
    await a.snapshots.delete(snapshotId);
  });

  it('lists, gets and deletes', async () => {
    let s1: Snapshot;
    let s2: Snapshot;
    {
      await using sb = await a.claim('img');
      s1 = await sb.snapshot({name: 'one', labels: {run: 'list', k: '1'}});
      s2 = await sb.snapshot({name: 'two', labels: {run: 'list', k: '2'}});
    }
    assert.deepEqual((await a.snapshots.list({labels: {run: 'list'}})).map((s) => s.id), [s1.id, s2.id]);
    assert.deepEqual((await a.snapshots.list({labels: {k: '2'}})).map((s) => s.id), [s2.id]);
    const got = await a.snapshots.get(s1.id);
    assert.equal(got.name, 'one');
    assert.equal(got.owner, 'tenant-a');
    assert.equal(got.sizeBytes, s1.sizeBytes);
    await a.snapshots.delete(s1);
    await assert.rejects(a.snapshots.get(s1), (e: unknown) => e instanceof NotFound && e.message.includes(s1.id));
    await assert.rejects(a.snapshots.delete(s1.id), NotFound);
    await a.snapshots.delete(s2.id);
    assert.deepEqual(await a.snapshots.list({labels: {run: 'list'}}), []);
  });

  it('another tenant gets NotFound for the snapshot on get, reset, fork and delete', async () => {
    await using sb = await a.claim('img');
    await sb.files.write('state', 'tenant A\n');
    const snap = await sb.snapshot({name: 'secret'});
    {
      await using theirs = await b.claim('img');
      await theirs.files.write('state', 'tenant B\n');
      await assert.rejects(b.snapshots.get(snap.id), NotFound);
      await assert.rejects(theirs.reset(snap.id), NotFound);
      assert.equal(await theirs.files.readText('state'), 'tenant B\n');
      await assert.rejects(b.fork(snap.id, 1), NotFound);
      await assert.rejects(b.fork(b.sandbox(sb.claimId), 1), NotFound);  // A's live sandbox
      await assert.rejects(b.snapshots.delete(snap.id), NotFound);
      assert.deepEqual((await b.snapshots.list()).map((s) => s.id), []);
      assert.deepEqual((await b.listClaims({states: ['active']})).map((c) => c.claimId), [theirs.claimId]);
    }
    assert.equal((await a.snapshots.get(snap.id)).name, 'secret');
    await a.snapshots.delete(snap);
  });
});
