// snapshot_sandbox, reset_sandbox and fork_sandbox (issue 37) through sbx-mcp, driven by
// the MCP SDK's client, against a real sbx-server (root: local runtime, bubblewrap, a pool
// "default" of a busybox image built here offline by tests/images/test_images.py) with two
// tenants: a snapshot, changes, a reset brings the files back; forks of a snapshot and of
// a live sandbox are the session's; tenant B's sbx-mcp cannot reset its sandbox to A's
// snapshot, nor touch A's sandbox, nor fork A's snapshot; two HTTP sessions of one sbx-mcp
// (one tenant) cannot use each other's snapshots; a session's snapshots are deleted when it
// ends.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {after, before, describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Client as SbxClient} from '@sbx/client';

import {call, callFails, httpClient, stdioClient, waitFor, World} from './harness.js';

// dist-test/test -> the repository's tests/images.
const kTestImages = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../../tests/images');
const kHttpToken = 'mcp-http-token-0123456789abcdef';

let world: World;
let sbxA: SbxClient;
let a: Awaited<ReturnType<typeof stdioClient>>;
let b: Awaited<ReturnType<typeof stdioClient>>;

before(async () => {
  world = new World();
  fs.chmodSync(world.dir, 0o755);  // image sandboxes run as uids of their own, below it
  const images = path.join(world.dir, 'images');
  fs.mkdirSync(images, {mode: 0o755});
  const script = [
    'import sys', `sys.path.insert(0, ${JSON.stringify(kTestImages)})`, 'import test_images',
    `print(test_images.busybox_image(${JSON.stringify(path.join(images, 'mcp'))}, "v1", config={"Env": ["PATH=/bin"]}))`,
  ].join('\n');
  const ref = execFileSync('/usr/bin/python3', ['-c', script], {encoding: 'utf8'}).trim();
  const config = path.join(world.dir, 'config.yaml');
  fs.writeFileSync(config, `
templates:
  - name: img
    runtime: local
    local: {image: "${ref}", network: false, workspace_size_bytes: 268435456, layer_size_bytes: 268435456}
pools:
  - {name: default, template: img, min_warm: 2, max_warm: 4, empty_pool_policy: wait, default_wait: 60s}
`);
  await world.start(['--image_cache_bytes=1000000000', `--image_import_dir=${images}`],
                    {config, tokens: ['token-a tenant-a', 'token-b tenant-b']});
  sbxA = new SbxClient({server: world.sbxTarget, token: 'token-a'});
  a = await stdioClient(world, [], {SBX_TOKEN: 'token-a'});
  b = await stdioClient(world, [], {SBX_TOKEN: 'token-b'});
});

after(async () => {
  await a?.client.close();
  await b?.client.close();
  sbxA?.close();
  await world?.cleanUp();
});

describe('snapshots through sbx-mcp', () => {
  it('snapshot, change, reset: the files are back', async () => {
    const {sandbox} = await call(a.client, 'claim_sandbox', {ttl: '10m'});
    await call(a.client, 'write_file', {sandbox, path: 'notes.txt', content: 'v1\n'});
    assert.equal((await call(a.client, 'run_command', {sandbox, command: 'mkdir -p /opt && echo app > /opt/f'})).exit_code, 0);
    const snap = await call(a.client, 'snapshot_sandbox', {sandbox, name: 'checkpoint'});
    assert.match(snap.snapshot, /^sn-[a-z0-9]{16}$/);
    assert.equal(snap.name, 'checkpoint');
    assert.ok(snap.size_bytes > 0);
    await call(a.client, 'write_file', {sandbox, path: 'notes.txt', content: 'v2\n'});
    await call(a.client, 'run_command', {sandbox, command: 'rm /opt/f; echo junk > junk'});
    await call(a.client, 'start_process', {sandbox, command: 'sleep 600', tag: 'sleeper'});
    const r = await call(a.client, 'reset_sandbox', {sandbox, snapshot: snap.snapshot});
    assert.deepEqual(r, {sandbox, snapshot: snap.snapshot, reset: true});
    assert.equal((await call(a.client, 'read_file', {sandbox, path: 'notes.txt'})).content, 'v1\n');
    const after = await call(a.client, 'run_command', {sandbox, command: 'cat /opt/f; test -e junk || echo no-junk'});
    assert.equal(after.stdout, 'app\nno-junk\n');
    const procs = await call(a.client, 'list_processes', {sandbox});
    assert.doesNotMatch(procs.processes, /sleep 600 *$/m);
    const listed = await call(a.client, 'list_sandboxes', {});
    assert.deepEqual(listed.snapshots.map((s: {snapshot: string}) => s.snapshot), [snap.snapshot]);
    await call(a.client, 'release_sandbox', {sandbox});
  });

  it('forks a snapshot and a live sandbox into sandboxes of the session', async () => {
    const {sandbox} = await call(a.client, 'claim_sandbox', {});
    await call(a.client, 'write_file', {sandbox, path: 'state', content: 'base\n'});
    const snap = await call(a.client, 'snapshot_sandbox', {sandbox});
    await call(a.client, 'write_file', {sandbox, path: 'state', content: 'live\n'});
    const forked = await call(a.client, 'fork_sandbox', {snapshot: snap.snapshot, count: 2, ttl: '10m'});
    assert.equal(forked.snapshot, snap.snapshot);
    assert.equal(forked.sandboxes.length, 2);
    for (const f of forked.sandboxes) {
      assert.equal((await call(a.client, 'read_file', {sandbox: f.sandbox, path: 'state'})).content, 'base\n');
    }
    await call(a.client, 'write_file', {sandbox: forked.sandboxes[0].sandbox, path: 'state', content: 'mine\n'});
    assert.equal((await call(a.client, 'read_file', {sandbox: forked.sandboxes[1].sandbox, path: 'state'})).content, 'base\n');
    const live = await call(a.client, 'fork_sandbox', {sandbox, count: 1});
    assert.notEqual(live.snapshot, snap.snapshot);
    assert.equal((await call(a.client, 'read_file', {sandbox: live.sandboxes[0].sandbox, path: 'state'})).content, 'live\n');
    // The live sandbox's snapshot is the session's: it can reset to it.
    await call(a.client, 'reset_sandbox', {sandbox: forked.sandboxes[0].sandbox, snapshot: live.snapshot});
    assert.equal((await call(a.client, 'read_file', {sandbox: forked.sandboxes[0].sandbox, path: 'state'})).content, 'live\n');
    assert.match(await callFails(a.client, 'fork_sandbox', {snapshot: snap.snapshot, sandbox, count: 1}), /INVALID_ARGUMENT: give either/);
    assert.match(await callFails(a.client, 'fork_sandbox', {snapshot: snap.snapshot, count: 8}), /RESOURCE_EXHAUSTED: this session holds 4 sandboxes/);
    for (const s of [sandbox, ...forked.sandboxes.map((f: {sandbox: string}) => f.sandbox), live.sandboxes[0].sandbox]) {
      await call(a.client, 'release_sandbox', {sandbox: s});
    }
  });

  it('tenant B cannot reset to, fork or touch A\'s snapshot and sandbox: NOT_FOUND', async () => {
    const {sandbox: mine} = await call(a.client, 'claim_sandbox', {});
    await call(a.client, 'write_file', {sandbox: mine, path: 'secret', content: 'tenant A\n'});
    const snap = await call(a.client, 'snapshot_sandbox', {sandbox: mine});
    const {sandbox: theirs} = await call(b.client, 'claim_sandbox', {});
    await call(b.client, 'write_file', {sandbox: theirs, path: 'secret', content: 'tenant B\n'});
    assert.match(await callFails(b.client, 'reset_sandbox', {sandbox: theirs, snapshot: snap.snapshot}), /NOT_FOUND/);
    assert.match(await callFails(b.client, 'fork_sandbox', {snapshot: snap.snapshot, count: 1}), /NOT_FOUND/);
    assert.match(await callFails(b.client, 'reset_sandbox', {sandbox: mine, snapshot: snap.snapshot}), /PERMISSION_DENIED/);
    assert.match(await callFails(b.client, 'snapshot_sandbox', {sandbox: mine}), /PERMISSION_DENIED/);
    assert.equal((await call(b.client, 'read_file', {sandbox: theirs, path: 'secret'})).content, 'tenant B\n');
    assert.equal((await call(a.client, 'read_file', {sandbox: mine, path: 'secret'})).content, 'tenant A\n');
    await call(a.client, 'release_sandbox', {sandbox: mine});
    await call(b.client, 'release_sandbox', {sandbox: theirs});
  });

  it('two HTTP sessions of one tenant cannot use each other\'s snapshots', async () => {
    const {url} = await world.startHttp(kHttpToken, [], {SBX_TOKEN: 'token-a'});
    const one = await httpClient(url, kHttpToken);
    const two = await httpClient(url, kHttpToken);
    try {
      const {sandbox: s1} = await call(one.client, 'claim_sandbox', {});
      await call(one.client, 'write_file', {sandbox: s1, path: 'secret', content: 'session one\n'});
      const snap = await call(one.client, 'snapshot_sandbox', {sandbox: s1});
      const {sandbox: s2} = await call(two.client, 'claim_sandbox', {});
      assert.match(await callFails(two.client, 'reset_sandbox', {sandbox: s2, snapshot: snap.snapshot}),
                   /NOT_FOUND: snapshot "sn-[a-z0-9]+" is not one of this session's snapshots/);
      assert.match(await callFails(two.client, 'fork_sandbox', {snapshot: snap.snapshot, count: 1}), /NOT_FOUND/);
      assert.equal((await callFails(two.client, 'read_file', {sandbox: s2, path: 'secret'})).includes('NOT_FOUND'), true);
      // Session one's snapshot is deleted when it ends.
      await one.transport.terminateSession();
      await one.client.close();
      await waitFor('session one\'s snapshot deleted', async () =>
        !(await sbxA.snapshots.list()).some((s) => s.id === snap.snapshot));
    } finally {
      await one.client.close().catch(() => {});
      await two.client.close();
    }
  });

  it('deletes a stdio session\'s snapshots when it closes', async () => {
    const c = await stdioClient(world, [], {SBX_TOKEN: 'token-a'});
    const {sandbox} = await call(c.client, 'claim_sandbox', {});
    const snap = await call(c.client, 'snapshot_sandbox', {sandbox});
    const forked = await call(c.client, 'fork_sandbox', {snapshot: snap.snapshot, count: 1});
    assert.ok((await sbxA.snapshots.list()).some((s) => s.id === snap.snapshot));
    await c.client.close();
    await waitFor('the snapshot deleted', async () => !(await sbxA.snapshots.list()).some((s) => s.id === snap.snapshot));
    // After its sandbox and its fork, released first (a claimed fork keeps a snapshot).
    for (const id of [sandbox, forked.sandboxes[0].sandbox]) assert.equal((await sbxA.getClaim(id)).state, 'released');
  });
});
