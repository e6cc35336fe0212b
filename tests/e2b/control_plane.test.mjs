// The E2B control plane of sbx-server, driven by the unmodified `e2b` SDK (pinned in
// package.json) against a real sbx-server with the local runtime: create from a pool with
// timeout, metadata and envs; getInfo; list with metadata filters and pagination;
// setTimeout; pause and connect; kill; a bad key, an unknown template and another tenant's
// sandbox. Then what the SDK never sends but a client could: malformed requests, each
// answered with E2B's error body naming the problem.
import assert from 'node:assert/strict';
import net from 'node:net';
import {after, before, test} from 'node:test';

import {AuthenticationError, Sandbox, SandboxError, SandboxNotFoundError} from 'e2b';

import {ALICE, BOB, listAll, TestServer} from './harness.mjs';

const server = new TestServer();
const created = [];  // ids to kill at the end, whatever happens

before(async () => {
  await server.start();
  server.useFromE2b();
});

after(async () => {
  for (const id of created) await Sandbox.kill(id).catch(() => {});
  await server.cleanUp();
});

async function create(opts = {}) {
  const sbx = await Sandbox.create('default', {timeoutMs: 120_000, ...opts});
  created.push(sbx.sandboxId);
  return sbx;
}

test('create, getInfo, list by metadata, setTimeout, kill', async () => {
  const sbx = await create({metadata: {job: 'e2b-test', run: '1'}, envs: {FOO: 'bar'}});
  // The id is a claim id the server generated: usable in host names (PORT-ID.DOMAIN).
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/);
  assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.sbx.localhost`);

  const info = await Sandbox.getInfo(sbx.sandboxId);
  assert.equal(info.sandboxId, sbx.sandboxId);
  assert.equal(info.templateId, 'default');
  assert.deepEqual(info.metadata, {job: 'e2b-test', run: '1'});
  assert.equal(info.state, 'running');
  assert.ok(info.endAt > info.startedAt, `endAt ${info.endAt} after startedAt ${info.startedAt}`);
  const endBefore = info.endAt;

  const mine = await listAll(Sandbox.list({query: {metadata: {job: 'e2b-test'}}}));
  assert.deepEqual(mine.map((s) => s.sandboxId), [sbx.sandboxId]);
  assert.deepEqual(mine[0].metadata, {job: 'e2b-test', run: '1'});
  const none = await listAll(Sandbox.list({query: {metadata: {job: 'e2b-test', run: '2'}}}));
  assert.deepEqual(none, []);

  await Sandbox.setTimeout(sbx.sandboxId, 600_000);
  const later = await Sandbox.getInfo(sbx.sandboxId);
  assert.ok(later.endAt > endBefore, `endAt ${later.endAt} after setTimeout, was ${endBefore}`);
  await sbx.setTimeout(300_000);  // the instance method too

  assert.equal(await sbx.kill().then(() => true), true);
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError);
  assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'a killed sandbox is not found');
  await assert.rejects(Sandbox.setTimeout(sbx.sandboxId, 60_000), SandboxNotFoundError);
  const after = await listAll(Sandbox.list({query: {metadata: {job: 'e2b-test'}}}));
  assert.deepEqual(after, []);
});

test('list pages through every sandbox, and filters by state', async () => {
  const a = await create({metadata: {page: 'yes'}});
  const b = await create({metadata: {page: 'yes'}});
  const paginator = Sandbox.list({query: {metadata: {page: 'yes'}}, limit: 1});
  const first = await paginator.nextItems();
  assert.equal(first.length, 1);
  assert.equal(paginator.hasNext, true, 'a next token after a full page');
  const rest = await listAll(paginator);
  assert.deepEqual([...first, ...rest].map((s) => s.sandboxId).sort(),
                   [a.sandboxId, b.sandboxId].sort());

  assert.equal(await Sandbox.pause(a.sandboxId), true);
  assert.equal(await Sandbox.pause(a.sandboxId), false, 'already paused: 409, false');
  const paused = await listAll(Sandbox.list({query: {metadata: {page: 'yes'}, state: ['paused']}}));
  assert.deepEqual(paused.map((s) => [s.sandboxId, s.state]), [[a.sandboxId, 'paused']]);
  const running = await listAll(Sandbox.list({query: {metadata: {page: 'yes'}, state: ['running']}}));
  assert.deepEqual(running.map((s) => s.sandboxId), [b.sandboxId]);

  const again = await Sandbox.connect(a.sandboxId, {timeoutMs: 600_000});
  assert.equal(again.sandboxId, a.sandboxId);
  assert.equal((await Sandbox.getInfo(a.sandboxId)).state, 'running');
  await Sandbox.kill(a.sandboxId);
  await Sandbox.kill(b.sandboxId);
});

test('a bad API key is an AuthenticationError', async () => {
  await assert.rejects(Sandbox.create('default', {apiKey: 'e2b_not_a_token'}), AuthenticationError);
  await assert.rejects(Sandbox.list({apiKey: 'e2b_not_a_token'}).nextItems(), AuthenticationError);
  await assert.rejects(Sandbox.getInfo('abc', {apiKey: 'e2b_not_a_token'}), AuthenticationError);
});

test('an unknown template is a 404 naming it', async () => {
  // The SDK turns a 404 of create into a SandboxError carrying the status (it keeps
  // NotFoundError for other calls); the message names the template.
  await assert.rejects(Sandbox.create('no-such-pool', {timeoutMs: 60_000}), (err) => {
    assert.ok(err instanceof SandboxError, `${err}`);
    assert.equal(err.statusCode, 404);
    assert.match(err.message, /no-such-pool/);
    return true;
  });
});

test("another tenant's sandbox is not found, and left alone", async () => {
  const sbx = await create({metadata: {owner: 'alice'}});
  const asBob = {apiKey: BOB};
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, asBob), SandboxNotFoundError);
  assert.equal(await Sandbox.kill(sbx.sandboxId, asBob), false);
  await assert.rejects(Sandbox.setTimeout(sbx.sandboxId, 1_000, asBob), SandboxNotFoundError);
  await assert.rejects(Sandbox.pause(sbx.sandboxId, asBob), SandboxNotFoundError);
  await assert.rejects(Sandbox.connect(sbx.sandboxId, asBob), SandboxNotFoundError);
  assert.deepEqual(await listAll(Sandbox.list({...asBob, query: {metadata: {owner: 'alice'}}})), []);
  // Still alice's, still running, its timeout untouched by bob's call.
  const info = await Sandbox.getInfo(sbx.sandboxId, {apiKey: ALICE});
  assert.equal(info.state, 'running');
  assert.ok(info.endAt - Date.now() > 30_000, `endAt ${info.endAt}`);
  await Sandbox.kill(sbx.sandboxId);
});

// Raw HTTP: what a client other than the SDK may send.
async function call(method, path, {body, key = ALICE, headers = {}} = {}) {
  const res = await fetch(`${server.url}${path}`, {
    method,
    headers: {'X-API-Key': key, 'Content-Type': 'application/json', ...headers},
    body,
  });
  const text = await res.text();
  return {status: res.status, body: text ? JSON.parse(text) : undefined, headers: res.headers};
}

test('bad requests get E2B error bodies naming the problem', async () => {
  const cases = [
    ['POST', '/sandboxes', '{"templateID": ', 400, /not a JSON object/],
    ['POST', '/sandboxes', '[]', 400, /not a JSON object/],
    ['POST', '/sandboxes', '{}', 400, /templateID/],
    ['POST', '/sandboxes', '{"templateID": "default", "timeout": "soon"}', 400, /"timeout"/],
    ['POST', '/sandboxes', '{"templateID": "default", "timeout": 0}', 400, /"timeout"/],
    ['POST', '/sandboxes', '{"templateID": "default", "metadata": {"k": 1}}', 400, /"metadata"."k"/],
    ['POST', '/sandboxes', '{"templateID": "default", "metadata": {"bad key!": "v"}}', 400, /bad key!/],
    ['POST', '/sandboxes', '{"templateID": "default", "autoPause": true}', 400, /autoPause/],
    ['GET', '/v2/sandboxes?limit=0', undefined, 400, /limit/],
    ['GET', '/v2/sandboxes?state=sleeping', undefined, 400, /sleeping/],
    ['GET', '/v2/sandboxes?metadata=%zz', undefined, 400, /metadata|escape/],
    ['GET', '/sandboxes/..%2F..%2Fetc', undefined, 404, /not found/],
    ['GET', '/sandboxes/0123456789abcdef0123456789abcdef', undefined, 404, /not found/],
    ['POST', '/sandboxes/x/snapshots', '{}', 404, /not found/],
    ['POST', '/sandboxes/x/snapshots', '{"name": 7}', 400, /name/],
    ['GET', '/snapshots?limit=101', undefined, 400, /limit/],
    ['DELETE', '/templates/sn-0000000000000000', undefined, 404, /not found/],
    ['DELETE', '/templates/default', undefined, 501, /not served/],
    ['POST', '/sandboxes/x/fork', '{}', 404, /not found/],
    ['POST', '/sandboxes/x/fork', '{"count": 0}', 400, /count/],
    ['POST', '/sandboxes/x/fork', '{"count": 101}', 400, /count/],
    ['GET', '/templates', undefined, 501, /not served/],
    ['GET', '/volumecontent/v1/file', undefined, 501, /not served/],
    ['GET', '/secrets', undefined, 501, /not served/],
    ['PUT', '/sandboxes/x/network', '{}', 501, /network/],
    ['GET', '/nothing/here', undefined, 404, /not an endpoint|not served/],
  ];
  for (const [method, path, body, status, message] of cases) {
    const res = await call(method, path, {body});
    assert.equal(res.status, status, `${method} ${path} ${body}: ${JSON.stringify(res.body)}`);
    assert.equal(res.body.code, status, `${method} ${path}`);
    assert.match(res.body.message, message, `${method} ${path}`);
  }
  const noKey = await fetch(`${server.url}/v2/sandboxes`);
  assert.equal(noKey.status, 401);
});

test('keep-alive carries several requests; oversized and malformed ones are refused', async () => {
  // Three requests on one connection, answered in order.
  const answers = await rawExchange(
      ['GET', 'GET', 'GET'].map(() =>
          `GET /v2/sandboxes?metadata=none%3Dx HTTP/1.1\r\nHost: x\r\nX-API-Key: ${ALICE}\r\n\r\n`).join(''),
      (text) => (text.match(/HTTP\/1\.1 200/g) ?? []).length === 3);
  assert.equal((answers.match(/HTTP\/1\.1 200/g) ?? []).length, 3, answers);

  const big = 'x'.repeat(2 * 1024 * 1024);
  const tooBig = await rawExchange(
      `POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: ${big.length}\r\n\r\n`, null);
  assert.match(tooBig, /^HTTP\/1\.1 413/);

  const garbage = await rawExchange('NOT HTTP AT ALL\r\n\r\n', null);
  assert.match(garbage, /^HTTP\/1\.1 400/);

  const hugeHeader = await rawExchange(
      `GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-Junk: ${'y'.repeat(64 * 1024)}\r\n\r\n`, null);
  assert.match(hugeHeader, /^HTTP\/1\.1 431/);
});

// Sends `bytes` on a fresh connection and returns what came back, once `done(text)` holds
// or the server closed the connection (5 s at most).
function rawExchange(bytes, done) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(server.e2bPort, '127.0.0.1');
    let text = '';
    const finish = () => { clearTimeout(timer); sock.destroy(); resolve(text); };
    const timer = setTimeout(finish, 5000);
    sock.on('data', (d) => {
      text += d;
      if (done && done(text)) finish();
    });
    sock.on('end', finish);
    sock.on('close', finish);
    sock.on('error', (e) => (text ? finish() : reject(e)));
    sock.write(bytes);
  });
}
