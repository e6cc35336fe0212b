// sbx-mcp --http driven by the MCP SDK's Streamable HTTP client, against a real
// sbx-server with real sandboxes: the bearer token (none, wrong, refusal to start
// without one), sessions owning their sandboxes (B cannot use A's), and the release of
// a session's sandboxes on DELETE and after its idle timeout.
import assert from 'node:assert/strict';
import type {ChildProcess} from 'node:child_process';
import {once} from 'node:events';
import {after, before, describe, it} from 'node:test';

import {Client as SbxClient} from '@sbx/client';

import {call, callFails, httpClient, kCli, waitFor, World} from './harness.js';

const kToken = 'test-token-0123456789abcdef';
let world: World;
let sbx: SbxClient;
let url: URL;

before(async () => {
  world = await new World().start();
  sbx = new SbxClient({server: world.sbxTarget});
  ({url} = await world.startHttp(kToken));
});

after(async () => {
  sbx?.close();
  await world?.cleanUp();
});

const initialize = JSON.stringify({
  jsonrpc: '2.0', id: 1, method: 'initialize',
  params: {protocolVersion: '2025-06-18', capabilities: {}, clientInfo: {name: 'curl', version: '0'}},
});

async function post(headers: Record<string, string>): Promise<Response> {
  return fetch(url, {method: 'POST', body: initialize,
                     headers: {'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers}});
}

describe('http', () => {
  it('answers 401 without the bearer token or with a wrong one', async () => {
    const none = await post({});
    assert.equal(none.status, 401);
    assert.match(none.headers.get('www-authenticate') ?? '', /^Bearer/);
    assert.equal((await post({authorization: `Bearer ${kToken}x`})).status, 401);
    assert.equal((await post({authorization: `Bearer ${kToken.slice(0, -1)}`})).status, 401);
    assert.equal((await post({authorization: kToken})).status, 401);
    assert.equal((await post({authorization: `Bearer ${kToken}`})).status, 200);
    await assert.rejects(httpClient(url, 'wrong-token-0123456789'));
  });

  it('refuses to start without a token', async () => {
    const proc = world.spawn(process.execPath, [kCli, '--http', '--listen', '127.0.0.1:0'], {...world.sbxEnv, SBX_MCP_TOKEN: ''});
    const [code] = await once(proc, 'exit') as [number];
    assert.equal(code, 2);
    assert.match(world.log(proc), /--http needs a bearer token/);
  });

  it('gives each session its own sandboxes: B cannot use A\'s', async () => {
    const a = await httpClient(url, kToken);
    const b = await httpClient(url, kToken);
    try {
      assert.notEqual(a.transport.sessionId, b.transport.sessionId);
      const sa = (await call(a.client, 'claim_sandbox', {ttl: '5m'})).sandbox;
      assert.equal((await call(a.client, 'run_command', {sandbox: sa, command: 'echo a > mine; cat mine'})).stdout, 'a\n');

      const proc = await call(a.client, 'start_process', {sandbox: sa, tag: 'a-proc', command: 'sleep 300'});
      for (const [tool, args] of [['run_command', {command: 'cat mine'}], ['read_file', {path: 'mine'}],
                                  ['write_file', {path: 'mine', content: 'b'}], ['list_files', {}],
                                  ['start_process', {command: 'id'}], ['read_process_output', {process: 'a-proc'}],
                                  ['stop_process', {process: proc.pid, signal: 'KILL'}], ['list_processes', {}],
                                  ['get_port_url', {port: 8000}],
                                  ['renew_sandbox', {}], ['release_sandbox', {}]] as const) {
        const text = await callFails(b.client, tool, {sandbox: sa, ...args});
        assert.match(text, new RegExp(`PERMISSION_DENIED: sandbox "${sa}" is not one of this session's sandboxes`), tool);
      }
      assert.deepEqual((await call(b.client, 'list_sandboxes', {})).sandboxes, []);
      const res = await b.client.readResource({uri: 'sbx://sandboxes'});
      assert.deepEqual(JSON.parse((res.contents[0] as {text: string}).text).sandboxes, []);

      // A's sandbox is untouched and still A's, its process running.
      assert.equal((await call(a.client, 'read_file', {sandbox: sa, path: 'mine'})).content, 'a\n');
      assert.match((await call(a.client, 'list_processes', {sandbox: sa})).processes, /a-proc running/);
      assert.equal((await sbx.getClaim(sa)).state, 'active');
    } finally {
      await a.transport.terminateSession();
      await b.transport.terminateSession();
      await a.client.close();
      await b.client.close();
    }
  });

  it('releases a session\'s sandboxes when it is deleted, and forgets the session', async () => {
    const a = await httpClient(url, kToken);
    const s1 = (await call(a.client, 'claim_sandbox', {})).sandbox;
    const s2 = (await call(a.client, 'claim_sandbox', {})).sandbox;
    assert.equal((await sbx.getClaim(s1)).state, 'active');
    const sessionId = a.transport.sessionId!;
    await a.transport.terminateSession();
    await a.client.close();
    for (const s of [s1, s2]) {
      await waitFor(`claim ${s} released`, async () => (await sbx.getClaim(s)).state === 'released');
    }
    const stale = await fetch(url, {method: 'POST', body: JSON.stringify({jsonrpc: '2.0', id: 2, method: 'tools/list'}),
                                    headers: {'content-type': 'application/json', accept: 'application/json, text/event-stream',
                                              authorization: `Bearer ${kToken}`, 'mcp-session-id': sessionId}});
    assert.equal(stale.status, 404);
  });

  it('releases an idle session\'s sandboxes after the idle timeout', async () => {
    let proc: ChildProcess | undefined;
    try {
      const idle = await world.startHttp(kToken, ['--idle-timeout', '1s']);
      proc = idle.proc;
      const a = await httpClient(idle.url, kToken);
      const s = (await call(a.client, 'claim_sandbox', {})).sandbox;
      await waitFor(`claim ${s} released`, async () => (await sbx.getClaim(s)).state === 'released');
      assert.match(world.log(proc), /idle for more than 1000 ms/);
      await assert.rejects(a.client.listTools());
      await a.client.close();
    } finally {
      proc?.kill('SIGKILL');
    }
  });

  it('releases every session\'s sandboxes when stopped with SIGTERM', async () => {
    const other = await world.startHttp(kToken);
    const a = await httpClient(other.url, kToken);
    const s = (await call(a.client, 'claim_sandbox', {})).sandbox;
    other.proc.kill('SIGTERM');
    const [code] = await once(other.proc, 'exit') as [number];
    assert.equal(code, 0);
    assert.equal((await sbx.getClaim(s)).state, 'released');
    await a.client.close();
  });
});
