// sbx-mcp --stdio driven by the MCP SDK's own client, against a real sbx-server with
// real sandboxes: the tools and their schemas, claim, commands, files, the output
// bounds at the default 30,000 characters (exact counts), ownership, and the release
// of the session's sandboxes when the client closes.
import assert from 'node:assert/strict';
import {execFile} from 'node:child_process';
import path from 'node:path';
import {after, before, describe, it} from 'node:test';
import {promisify} from 'node:util';

import {Client as SbxClient} from '@sbx/client';

import {call, callFails, kCli, stdioClient, waitFor, World} from './harness.js';

let world: World;
let sbx: SbxClient;
let mcp: Awaited<ReturnType<typeof stdioClient>>;
let sandbox: string;

before(async () => {
  world = await new World().start();
  sbx = new SbxClient({server: world.sbxTarget});
  mcp = await stdioClient(world);
  sandbox = (await call(mcp.client, 'claim_sandbox', {ttl: '10m', env: {SEED: '7'}, files: {'in/a.txt': 'hello'}})).sandbox;
});

after(async () => {
  await mcp?.client.close();
  sbx?.close();
  await world?.cleanUp();
});

const cut = (n: number): string => `\n[... sbx-mcp: ${n} characters cut ...]\n`;

describe('stdio', () => {
  it('lists the tools with their input schemas, and the sandboxes resource', async () => {
    const {tools} = await mcp.client.listTools();
    const byName = new Map(tools.map((t) => [t.name, t]));
    assert.deepEqual([...byName.keys()].sort(), ['claim_sandbox', 'fork_sandbox', 'get_port_url', 'list_files',
                                                 'list_processes', 'list_sandboxes', 'read_file', 'read_process_output',
                                                 'release_sandbox', 'renew_sandbox', 'reset_sandbox', 'run_command',
                                                 'snapshot_sandbox', 'start_process', 'stop_process', 'write_file']);
    const props = (name: string): string[] => Object.keys(byName.get(name)!.inputSchema.properties ?? {}).sort();
    assert.deepEqual(props('claim_sandbox'), ['env', 'files', 'pool', 'ttl']);
    assert.deepEqual(props('run_command'), ['command', 'cwd', 'env', 'sandbox', 'stdin', 'timeout']);
    assert.deepEqual(byName.get('run_command')!.inputSchema.required, ['sandbox', 'command']);
    const timeout = byName.get('run_command')!.inputSchema.properties!.timeout as {maximum: number; description: string};
    assert.equal(timeout.maximum, 600);
    assert.match(timeout.description, /Default 60/);
    for (const t of tools) assert.ok(t.description && t.description.length > 20, `${t.name} has no description`);

    const {resources} = await mcp.client.listResources();
    assert.deepEqual(resources.map((r) => r.uri), ['sbx://sandboxes']);
    const read = await mcp.client.readResource({uri: 'sbx://sandboxes'});
    const listed = JSON.parse((read.contents[0] as {text: string}).text);
    assert.deepEqual(listed.sandboxes.map((s: {sandbox: string}) => s.sandbox), [sandbox]);
    assert.equal(listed.sandboxes[0].pool, 'default');
  });

  it('claims a sandbox that holds the env and files, and runs commands in it', async () => {
    const claim = await sbx.getClaim(sandbox);
    assert.equal(claim.state, 'active');
    assert.equal(claim.pool, 'default');

    const r = await call(mcp.client, 'run_command', {sandbox, command: 'echo out $SEED $X; cat a.txt; echo err >&2; exit 3',
                                                     cwd: 'in', env: {X: 'x'}});
    assert.equal(r.stdout, 'out 7 x\nhello');
    assert.equal(r.stderr, 'err\n');
    assert.equal(r.exit_code, 3);
    assert.equal(r.timed_out, false);
    assert.equal(r.truncated, false);
    assert.equal(r.stdout_bytes, 13);

    const piped = await call(mcp.client, 'run_command', {sandbox, command: 'wc -c', stdin: '12345'});
    assert.equal(piped.stdout.trim(), '5');

    const slow = await call(mcp.client, 'run_command', {sandbox, command: 'sleep 30', timeout: 0.3});
    assert.equal(slow.timed_out, true);
    assert.equal(slow.exit_code, null);

    const tooLong = await mcp.client.callTool({name: 'run_command', arguments: {sandbox, command: 'true', timeout: 601}});
    assert.equal(tooLong.isError, true);
  });

  it('cuts stdout and stderr at 30,000 characters together, keeping head and tail', async () => {
    const gen = (n: number, ch: string, fd = 1): string => `head -c ${n} /dev/zero | tr '\\0' ${ch} >&${fd}`;
    const exact = await call(mcp.client, 'run_command', {sandbox, command: gen(30000, 'a')});
    assert.equal(exact.truncated, false);
    assert.equal(exact.stdout.length, 30000);

    const one = await call(mcp.client, 'run_command', {sandbox, command: `printf b; ${gen(30000, 'a')}`});
    assert.equal(one.truncated, true);
    assert.equal(one.stdout_bytes, 30001);
    assert.equal(one.stdout, 'b' + 'a'.repeat(14999) + cut(1) + 'a'.repeat(15000));

    const both = await call(mcp.client, 'run_command', {sandbox, command: `${gen(40000, 'o')}; ${gen(25000, 'e', 2)}`});
    assert.equal(both.truncated, true);
    assert.equal(both.stdout_bytes, 40000);
    assert.equal(both.stderr_bytes, 25000);
    assert.equal(both.stdout, 'o'.repeat(7500) + cut(25000) + 'o'.repeat(7500));
    assert.equal(both.stderr, 'e'.repeat(7500) + cut(10000) + 'e'.repeat(7500));

    const small = await call(mcp.client, 'run_command', {sandbox, command: `echo tiny; ${gen(50000, 'e', 2)}`});
    assert.equal(small.stdout, 'tiny\n');
    assert.equal(small.stderr, 'e'.repeat(14997) + cut(20005) + 'e'.repeat(14998));
  });

  it('writes, reads (text, base64, in bounded parts) and lists files', async () => {
    const w = await call(mcp.client, 'write_file', {sandbox, path: 'dir/run.sh', content: 'echo ran\n', mode: '755'});
    assert.equal(w.size, 9);
    assert.equal((await call(mcp.client, 'run_command', {sandbox, command: './dir/run.sh'})).stdout, 'ran\n');
    await call(mcp.client, 'write_file', {sandbox, path: 'dir/run.sh', content: 'echo more\n', append: true});
    const text = await call(mcp.client, 'read_file', {sandbox, path: 'dir/run.sh'});
    assert.equal(text.content, 'echo ran\necho more\n');
    assert.equal(text.truncated, false);
    assert.equal(text.next_offset, null);

    const bin = Buffer.from([0, 1, 2, 250, 255]);
    await call(mcp.client, 'write_file', {sandbox, path: 'b.bin', content: bin.toString('base64'), encoding: 'base64'});
    assert.equal((await call(mcp.client, 'read_file', {sandbox, path: 'b.bin', encoding: 'base64'})).content, bin.toString('base64'));

    // 40,000 two-byte characters: 30,000 of them (60,000 bytes), then the rest from next_offset.
    await call(mcp.client, 'write_file', {sandbox, path: 'e.txt', content: 'é'.repeat(40000)});
    const first = await call(mcp.client, 'read_file', {sandbox, path: 'e.txt'});
    assert.equal(first.content, 'é'.repeat(30000));
    assert.equal(first.truncated, true);
    assert.equal(first.size, 80000);
    assert.equal(first.next_offset, 60000);
    const rest = await call(mcp.client, 'read_file', {sandbox, path: 'e.txt', offset: first.next_offset});
    assert.equal(rest.content, 'é'.repeat(10000));
    assert.equal(rest.truncated, false);
    const b64 = await call(mcp.client, 'read_file', {sandbox, path: 'e.txt', encoding: 'base64'});
    assert.equal(b64.bytes, 22500);
    assert.equal(b64.content.length, 30000);
    assert.equal(b64.next_offset, 22500);

    const top = await call(mcp.client, 'list_files', {sandbox});
    assert.match(top.entries, /^d \d+ dir\/$/m);
    assert.match(top.entries, /^f 5 b\.bin$/m);
    const sub = await call(mcp.client, 'list_files', {sandbox, path: 'dir'});
    assert.equal(sub.entries, 'f 19 dir/run.sh\n');

    // 3,000 lines "f 0 many/fNNNN" of 14 characters plus a newline: 2,000 fit in 30,000.
    await call(mcp.client, 'run_command', {sandbox, command: 'mkdir many && cd many && for i in $(seq 1000 3999); do : > f$i; done'});
    const many = await call(mcp.client, 'list_files', {sandbox, path: 'many'});
    assert.equal(many.total_entries, 3000);
    assert.equal(many.shown_entries, 2000);
    assert.equal(many.truncated, true);
    assert.equal(many.entries.length, 30000);

    const missing = await callFails(mcp.client, 'read_file', {sandbox, path: 'no/such'});
    assert.match(missing, /NOT_FOUND/);
  });

  it('refuses claims the session did not make, even when they exist', async () => {
    const other = await sbx.claim('default', {ttl: '5m', wait: '60s'});
    try {
      const text = await callFails(mcp.client, 'run_command', {sandbox: other.claimId, command: 'true'});
      assert.match(text, /PERMISSION_DENIED/);
      assert.match(text, new RegExp(`"${other.claimId}" is not one of this session's sandboxes`));
      for (const tool of ['read_file', 'write_file', 'list_files', 'release_sandbox', 'renew_sandbox']) {
        const t = await callFails(mcp.client, tool, {sandbox: other.claimId, path: 'x', content: 'x'});
        assert.match(t, /not one of this session's sandboxes/, tool);
      }
      assert.equal((await other.refresh()).state, 'active');
    } finally {
      await other.release();
    }
  });

  it('renews and releases', async () => {
    const extra = (await call(mcp.client, 'claim_sandbox', {ttl: '1m'})).sandbox;
    const before = (await sbx.getClaim(extra)).expiresAt!.getTime();
    const renewed = await call(mcp.client, 'renew_sandbox', {sandbox: extra, ttl: '2h'});
    assert.ok(new Date(renewed.expires_at).getTime() > before + 30 * 60 * 1000);
    assert.equal((await call(mcp.client, 'release_sandbox', {sandbox: extra})).state, 'released');
    assert.equal((await sbx.getClaim(extra)).state, 'released');
    assert.match(await callFails(mcp.client, 'run_command', {sandbox: extra, command: 'true'}), /was released/);
    const listed = await call(mcp.client, 'list_sandboxes', {});
    assert.deepEqual(listed.sandboxes.map((s: {sandbox: string}) => s.sandbox), [sandbox]);
  });

  it('names the problem of a bad claim', async () => {
    assert.match(await callFails(mcp.client, 'claim_sandbox', {pool: 'no-such-pool'}), /claim_sandbox failed: NOT_FOUND: .*no-such-pool/);
  });

  it('releases the session\'s sandboxes when the client closes', async () => {
    assert.equal((await sbx.getClaim(sandbox)).state, 'active');
    await mcp.client.close();
    await waitFor(`claim ${sandbox} released`, async () => (await sbx.getClaim(sandbox)).state === 'released');
    assert.match(mcp.stderr(), /releasing 1 sandbox/);
  });
});

describe('examples', () => {
  it('quickstart.mjs runs as docs/mcp.md shows', async () => {
    const script = path.resolve(path.dirname(kCli), '../examples/quickstart.mjs');
    const {stdout} = await promisify(execFile)(process.execPath, [script], {env: {...process.env, ...world.sbxEnv}, timeout: 40000});
    assert.match(stdout, /^tools: claim_sandbox .*run_command/m);
    assert.match(stdout, /^hello from Linux \(exit 0\)$/m);
    const left = await sbx.listClaims({states: ['active']});
    assert.deepEqual(left.map((c) => c.claimId).filter((id) => id.startsWith('mcp-')), []);
  });
});

describe('configured options', () => {
  it('--max-output-chars bounds every result; --progress-interval paces progress while a command runs', async () => {
    const small = await stdioClient(world, ['--max-output-chars', '1000', '--progress-interval', '200ms']);
    try {
      const sb = (await call(small.client, 'claim_sandbox', {})).sandbox;
      const r = await call(small.client, 'run_command', {sandbox: sb, command: 'seq 1 1000'});
      assert.equal(r.stdout_bytes, 3893);
      assert.equal(r.stdout.length, 1000 + cut(2893).length);
      assert.ok(r.stdout.startsWith('1\n2\n3\n') && r.stdout.endsWith('999\n1000\n'));
      await call(small.client, 'run_command', {sandbox: sb, command: 'seq 1 1000 > n.txt'});
      const f = await call(small.client, 'read_file', {sandbox: sb, path: 'n.txt'});
      assert.equal(f.content.length, 1000);
      assert.equal(f.next_offset, 1000);

      // The command waits for a file that is written once a progress notification came.
      const progress: number[] = [];
      let sawProgress!: () => void;
      const first = new Promise<void>((resolve) => { sawProgress = resolve; });
      const running = small.client.callTool(
          {name: 'run_command', arguments: {sandbox: sb, command: 'while [ ! -f go ]; do sleep 0.05; done; echo went', timeout: 30}},
          undefined, {onprogress: (p) => { progress.push(p.progress); assert.equal(p.total, 30); sawProgress(); }});
      await Promise.race([first, running.then(() => { throw new Error('the command ended before any progress'); })]);
      await call(small.client, 'write_file', {sandbox: sb, path: 'go', content: ''});
      const went = JSON.parse(((await running).content as {text: string}[])[0]!.text);
      assert.equal(went.stdout, 'went\n');
      assert.ok(progress.length >= 1);
      assert.ok(progress.every((p, i) => i === 0 || p > progress[i - 1]!), `progress ${progress} does not grow`);
    } finally {
      await small.client.close();
    }
  });
});
