// The process and port tools of sbx-mcp --stdio, driven by the MCP SDK's client against a
// real sbx-server (real sandboxes, its port proxy on 127.0.0.1:0): start_process,
// read_process_output (each byte once, bounded at the default 30,000 characters with the
// full byte counts), list_processes, stop_process (TERM, then KILL after the grace; an
// ended process is not an error), get_port_url then an HTTP fetch through the proxy, and
// a second MCP session refused every one of them on the first session's sandbox.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';

import {countChars} from '../src/limits.js';
import {call, callFails, stdioClient, World} from './harness.js';

const kHttpPort = 8767;
let world: World;
let mcp: Awaited<ReturnType<typeof stdioClient>>;
let sandbox: string;

before(async () => {
  world = await new World().start(['--proxy_listen=127.0.0.1:0']);
  mcp = await stdioClient(world);
  sandbox = (await call(mcp.client, 'claim_sandbox', {ttl: '10m'})).sandbox;
});

after(async () => {
  await mcp?.client.close();
  await world?.cleanUp();
});

describe('process tools', () => {
  it('start_process, read_process_output (each byte once), list_processes, stop_process', async () => {
    const started = await call(mcp.client, 'start_process', {
      sandbox, tag: 'worker', command: 'echo start; for i in 0 1 2; do echo line$i; done; echo oops >&2; sleep 300'});
    assert.ok(started.pid > 0);
    assert.equal(started.tag, 'worker');

    // Bounded wait until all four lines are out (the process writes them at once).
    let first = await call(mcp.client, 'read_process_output', {sandbox, process: 'worker', wait: 2});
    assert.equal(first.stdout, 'start\nline0\nline1\nline2\n');
    assert.equal(first.stderr, 'oops\n');
    assert.equal(first.running, true);
    assert.equal(first.exit_code, null);
    assert.equal(first.truncated, false);
    // Already read: nothing again (by pid this time).
    first = await call(mcp.client, 'read_process_output', {sandbox, process: started.pid});
    assert.equal(first.stdout, '');
    assert.equal(first.stdout_bytes, 0);

    const listed = await call(mcp.client, 'list_processes', {sandbox});
    assert.match(listed.processes, new RegExp(`^${started.pid} worker running sh -c `, 'm'));

    const stopped = await call(mcp.client, 'stop_process', {sandbox, process: 'worker'});
    assert.equal(stopped.signal_sent, 'TERM');
    assert.equal(stopped.killed, false);
    assert.equal(stopped.signal, 15);
    // Stopping it again: it has ended, which is not an error.
    const again = await call(mcp.client, 'stop_process', {sandbox, process: started.pid});
    assert.equal(again.signal_sent, null);
    assert.equal(again.signal, 15);

    // A process that ignores TERM is killed after the grace.
    await call(mcp.client, 'start_process', {sandbox, tag: 'stubborn', command: 'trap "" TERM; echo up; while :; do sleep 1; done'});
    await call(mcp.client, 'read_process_output', {sandbox, process: 'stubborn', wait: 1});
    const hard = await call(mcp.client, 'stop_process', {sandbox, process: 'stubborn', grace: 0.5});
    assert.equal(hard.killed, true);
    assert.equal(hard.signal, 9);
  });

  it('bounds the output at 30,000 characters with the full counts, and reports the exit', async () => {
    await call(mcp.client, 'start_process', {sandbox, tag: 'loud', command: 'head -c 200000 /dev/zero | tr "\\0" a; echo; exit 4'});
    const r = await call(mcp.client, 'read_process_output', {sandbox, process: 'loud', wait: 20});
    assert.equal(r.running, false);
    assert.equal(r.exit_code, 4);
    assert.equal(r.truncated, true);
    assert.equal(r.stdout_bytes, 200001);
    const marker = /\n\[\.\.\. sbx-mcp: \d+ (characters cut|bytes not kept) \.\.\.\]\n/g;
    assert.ok(countChars(r.stdout.replace(marker, '')) <= 30000, `${countChars(r.stdout)} characters`);
    assert.ok(r.stdout.startsWith('aaaa') && r.stdout.endsWith('a\n'));
  });

  it('names the problem: unknown process, bad tag', async () => {
    assert.match(await callFails(mcp.client, 'read_process_output', {sandbox, process: 'nosuch'}), /NOT_FOUND/);
    assert.match(await callFails(mcp.client, 'stop_process', {sandbox, process: 999999}), /NOT_FOUND/);
    const bad = await mcp.client.callTool({name: 'start_process', arguments: {sandbox, command: 'true', tag: 'bad tag'}});
    assert.equal(bad.isError, true);
  });

  it('get_port_url gives a URL that reaches a web server in the sandbox', async () => {
    await call(mcp.client, 'write_file', {sandbox, path: 'site/index.html', content: 'hello from the sandbox\n'});
    await call(mcp.client, 'start_process', {sandbox, tag: 'web', cwd: 'site',
                                              command: `exec python3 -m http.server ${kHttpPort} --bind 127.0.0.1`});
    const probe = await call(mcp.client, 'run_command', {sandbox, timeout: 30, command:
        `python3 -c "import socket,time,sys\nfor i in range(400):\n  try: socket.create_connection(('127.0.0.1',${kHttpPort})).close(); sys.exit(0)\n  except OSError: time.sleep(0.05)\nsys.exit(1)"`});
    assert.equal(probe.exit_code, 0, probe.stderr);
    const u = await call(mcp.client, 'get_port_url', {sandbox, port: kHttpPort, ttl: '5m'});
    assert.ok(new Date(u.expires_at).getTime() > Date.now());
    const res = await fetch(u.url);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), 'hello from the sandbox\n');
    await call(mcp.client, 'stop_process', {sandbox, process: 'web'});
  });

  it("a second session can use none of them on this session's sandbox", async () => {
    const proc = await call(mcp.client, 'start_process', {sandbox, tag: 'mine', command: 'sleep 300'});
    const other = await stdioClient(world);
    try {
      for (const [tool, args] of [
        ['start_process', {sandbox, command: 'id'}],
        ['read_process_output', {sandbox, process: 'mine'}],
        ['stop_process', {sandbox, process: proc.pid, signal: 'KILL'}],
        ['list_processes', {sandbox}],
        ['get_port_url', {sandbox, port: kHttpPort}],
      ] as const) {
        assert.match(await callFails(other.client, tool, args), /PERMISSION_DENIED: sandbox .* is not one of this session's/, tool);
      }
    } finally {
      await other.client.close();
    }
    const listed = await call(mcp.client, 'list_processes', {sandbox});
    assert.match(listed.processes, new RegExp(`^${proc.pid} mine running `, 'm'));
    await call(mcp.client, 'stop_process', {sandbox, process: 'mine'});
  });
});
