// Claims by image (issue 34): `claim({image})` and `claimBatch({image}, n)`.
//
// On the wire, against a fake ClaimService (grpc-js) that keeps the requests it decodes:
// a claim by image sends `image` and no pool, a claim by pool (a string or `{pool}`) the
// pool and no image; both, or neither, are InvalidArgument before any call.
//
// Against a real sbx-server (local runtime, an image cache, a busybox image built here
// offline by tests/images/test_images.py): a claim by image is served cold from the
// image's on-demand pool and runs the image; the next one reuses the pool; a batch by
// image takes its sandboxes from it; a reference the server does not take is
// InvalidArgument naming it.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {after, before, describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';

import {Client, InvalidArgument, type ClaimSource} from '@sbx/client';

import {TestServer} from './harness.js';

const kHere = path.dirname(fileURLToPath(import.meta.url));
const kProtoDir = path.resolve(kHere, '../../dist/proto');
// dist-test/test -> the repository's tests/images.
const kTestImages = path.resolve(kHere, '../../../../tests/images');
const kLoad = {includeDirs: [kProtoDir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true};

type Raw = Record<string, unknown>;

describe('on the wire', () => {
  const seen: {method: string; request: Raw}[] = [];
  let server: grpc.Server;
  let client: Client;

  before(async () => {
    const def = protoLoader.loadSync(['sbx/v1/claims.proto'], kLoad);
    const v1 = (grpc.loadPackageDefinition(def).sbx as grpc.GrpcObject).v1 as grpc.GrpcObject;
    const claim = (id: unknown) => ({claim_id: id, pool: 'image-0123456789ab', state: 'CLAIM_STATE_ACTIVE', sandbox: {id: 'sb-1'}});
    server = new grpc.Server();
    server.addService((v1.ClaimService as grpc.ServiceClientConstructor).service, {
      Claim: (call: grpc.ServerUnaryCall<Raw, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        seen.push({method: 'Claim', request: call.request});
        cb(null, {claim: claim(call.request.claim_id)});
      },
      ClaimBatch: (call: grpc.ServerUnaryCall<Raw, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        seen.push({method: 'ClaimBatch', request: call.request});
        cb(null, {batch_id: call.request.batch_id,
                  claims: Array.from({length: Number(call.request.count)}, (_, i) => claim(`${call.request.batch_id}#${i}`))});
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

  it('sends the image and no pool, or the pool and no image', async () => {
    seen.length = 0;
    const sb = await client.claim({image: 'oci:/images/a:v1'});
    assert.equal(sb.claim?.pool, 'image-0123456789ab');
    await client.claim('py');
    await client.claim({pool: 'py'});
    await client.claimBatch({image: 'python:3.12'}, 2);
    assert.deepEqual(seen.map((s) => [s.method, s.request.pool, s.request.image]), [
      ['Claim', '', 'oci:/images/a:v1'], ['Claim', 'py', ''], ['Claim', 'py', ''], ['ClaimBatch', '', 'python:3.12'],
    ]);
  });

  it('refuses both, or neither, before any call', async () => {
    seen.length = 0;
    for (const [from, message] of [
      [{pool: 'py', image: 'oci:/x:1'}, /give a pool \("py"\) or an image \("oci:\/x:1"\), not both/],
      [{}, /give a pool, or an image/],
      [{pool: '', image: ''}, /give a pool, or an image/],
    ] as [unknown, RegExp][]) {
      await assert.rejects(client.claim(from as ClaimSource), (e: unknown) => e instanceof InvalidArgument && message.test(e.message));
      await assert.rejects(client.claimBatch(from as ClaimSource, 2), InvalidArgument);
    }
    assert.deepEqual(seen, []);
  });
});

describe('against sbx-server', () => {
  let server: TestServer;
  let client: Client;
  let images: string;
  let ref: string;

  before(async () => {
    images = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-ts-img-'));
    fs.chmodSync(images, 0o755);
    const script = [
      'import sys', `sys.path.insert(0, ${JSON.stringify(kTestImages)})`, 'import test_images',
      `print(test_images.busybox_image(${JSON.stringify(path.join(images, 'ts'))}, "v1", extra=[` +
        '{"name": "etc", "type": "dir"}, {"name": "etc/os-release", "type": "file", "data": "ID=ts-image\\n"}]))',
    ].join('\n');
    ref = execFileSync('/usr/bin/python3', ['-c', script], {encoding: 'utf8'}).trim();
    server = new TestServer({runtime: 'local', extraArgs: ['--image_cache_bytes=1000000000', `--image_import_dir=${images}`]});
    fs.chmodSync(server.dir, 0o755);  // image sandboxes run as uids of their own, below it
    await server.start();
    client = new Client({server: server.target});
  });

  after(async () => {
    client?.close();
    await server?.cleanUp();
    fs.rmSync(images, {recursive: true, force: true});
  });

  it('serves a claim by image cold from its on-demand pool, which runs the image', async () => {
    let pool = '';
    {
      await using sb = await client.claim({image: ref}, {ttl: '10m'});
      pool = sb.claim!.pool;
      assert.match(pool, /^image-[0-9a-f]{12}$/);
      assert.equal(sb.claim?.launchType, 'cold');
      const r = await sb.exec('cat /etc/os-release');
      assert.equal(r.stdout, 'ID=ts-image\n');
    }
    {
      await using again = await client.claim({image: ref});
      assert.equal(again.claim?.pool, pool);
    }
    {
      await using group = await client.claimBatch({image: ref}, 2);
      assert.deepEqual(group.sandboxes.map((s) => s.claim?.pool), [pool, pool]);
    }
  });

  it('refuses a reference the server does not take', async () => {
    await assert.rejects(client.claim({image: 'bogus:thing'}),
                         (e: unknown) => e instanceof InvalidArgument && e.message.includes('bogus:thing'));
  });
});
