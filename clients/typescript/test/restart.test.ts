// Retries across a server restart: a claim retried with the same id while the server is
// down and after it is back returns the same claim and sandbox, and the server holds
// exactly one (local runtime: the restarted server adopts the running sandboxes).
import assert from 'node:assert/strict';
import {after, it} from 'node:test';
import {setTimeout as sleep} from 'node:timers/promises';

import {Client} from '@sbx/client';

import {TestServer} from './harness.js';

let server: TestServer | undefined;
let client: Client | undefined;

after(async () => {
  client?.close();
  await server?.cleanUp();
});

it('a claim retried across a crash and restart of the server returns the same sandbox', async () => {
  // Sandboxes must outlive the server for it to adopt them when it restarts.
  server = new TestServer({runtime: 'local', deleteSandboxesOnExit: false});
  await server.start();
  client = new Client({server: server.target, timeoutMs: 60000});
  const id = `restart-${process.pid}`;
  const first = await client.claim('default', {id, wait: '60s', ttl: '10m'});
  assert.equal(first.replayed, false);
  await first.files.write('mark', 'before the crash');

  // The server crashes; the client, not having seen an answer (a lost response), claims
  // again with the same id: the SDK gets UNAVAILABLE and keeps retrying.
  await server.stop('SIGKILL');
  let settled = false;
  const retry = client.claim('default', {id, wait: '60s', ttl: '10m'}).finally(() => { settled = true; });
  await sleep(500);
  assert.equal(settled, false, 'the claim gave up while the server was down');
  await server.start();  // same data dir, same port

  const again = await retry;
  assert.equal(again.claimId, id);
  assert.equal(again.replayed, true);
  assert.equal(again.sandboxId, first.sandboxId);
  assert.equal(await again.files.readText('mark'), 'before the crash');
  const active = await client.listClaims({states: ['active']});
  assert.deepEqual(active.map((c) => c.claimId), [id]);
  const pool = (await client.pools())[0]!;
  assert.equal(pool.status.claimed, 1);
  assert.equal((await again.release()).state, 'released');
});
