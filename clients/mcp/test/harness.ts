// Test harness: a real sbx-server (local runtime, the pool "default" of
// scripts/example-config.yaml) on 127.0.0.1 port 0 in a fresh temp dir, sbx-mcp processes
// against it, and MCP SDK clients for them. Everything started is killed at the end
// (local sandboxes run in their own sessions: every process naming the dir).
//
// The binaries come from the environment, set by ctest (tests/clients/mcp/CMakeLists.txt):
//   SBX_TEST_SERVER_BIN, SBX_TEST_SANDBOXD_BIN, SBX_TEST_CONFIG
import assert from 'node:assert/strict';
import {spawn, type ChildProcess} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {setTimeout as sleep} from 'node:timers/promises';
import {fileURLToPath} from 'node:url';

import {Client as McpClient} from '@modelcontextprotocol/sdk/client/index.js';
import {StdioClientTransport} from '@modelcontextprotocol/sdk/client/stdio.js';
import {StreamableHTTPClientTransport} from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type {CallToolResult} from '@modelcontextprotocol/sdk/types.js';

/** dist-test/test/ -> the package root, where dist/cli.js is. */
export const kCli = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../dist/cli.js');

function requireEnv(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this test through ctest (ctest -R mcp)`);
  return v;
}

/** Polls `cond` every 50 ms until it holds, or throws after `ms`. */
export async function waitFor(what: string, cond: () => Promise<boolean> | boolean, ms = 30000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(50);
  }
}

async function waitForFile(file: string, proc: ChildProcess, log: () => string): Promise<string> {
  let text = '';
  await waitFor(`${file}`, () => {
    if (proc.exitCode !== null) throw new Error(`${path.basename(file)}: process exited early:\n${log()}`);
    text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8').trim() : '';
    return /^\d+$/.test(text);
  });
  return text;
}

/** A temp dir with an sbx-server serving real local sandboxes without auth. */
export class World {
  readonly dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-mcp-')));
  sbxTarget = '';
  private readonly procs: ChildProcess[] = [];
  private readonly logs = new Map<ChildProcess, string>();

  /**
   * Starts sbx-server; `serverArgs` are added to its flags (e.g. its port proxy). `config`
   * replaces $SBX_TEST_CONFIG; `tokens` (lines '<token> <tenant> [admin]') turn on auth.
   */
  async start(serverArgs: string[] = [], opts: {config?: string; tokens?: string[]} = {}): Promise<this> {
    const portFile = path.join(this.dir, 'sbx-port');
    let auth = '--insecure_no_auth';
    if (opts.tokens) {
      fs.writeFileSync(path.join(this.dir, 'tokens'), opts.tokens.join('\n') + '\n');
      auth = '--auth_tokens_file=tokens';
    }
    const proc = this.spawn(requireEnv('SBX_TEST_SERVER_BIN'), [
      '--listen=127.0.0.1:0', '--metrics_listen=off', `--port_file=${portFile}`, '--data_dir=data',
      '--log_level=warn', `--config=${opts.config ?? requireEnv('SBX_TEST_CONFIG')}`,
      `--sandboxd=${requireEnv('SBX_TEST_SANDBOXD_BIN')}`, '--sandbox_root=sb', '--delete_sandboxes_on_exit',
      '--shutdown_grace_seconds=2', auth, ...serverArgs]);
    this.sbxTarget = `127.0.0.1:${await waitForFile(portFile, proc, () => this.logs.get(proc) ?? '')}`;
    return this;
  }

  /** Starts a process in the dir, logging its output; killed by cleanUp. */
  spawn(bin: string, args: string[], env: NodeJS.ProcessEnv = {}): ChildProcess {
    const proc = spawn(bin, args, {cwd: this.dir, detached: true, stdio: ['ignore', 'pipe', 'pipe'],
                                   env: {...process.env, ...env}});
    this.procs.push(proc);
    this.logs.set(proc, '');
    const add = (d: Buffer): void => { this.logs.set(proc, (this.logs.get(proc) ?? '') + d.toString()); };
    proc.stdout!.on('data', add);
    proc.stderr!.on('data', add);
    return proc;
  }

  log(proc: ChildProcess): string {
    return this.logs.get(proc) ?? '';
  }

  /** Environment for sbx-mcp: where sbx is. */
  get sbxEnv(): Record<string, string> {
    return {SBX_SERVER: this.sbxTarget};
  }

  /** Starts `sbx-mcp --http` on port 0; resolves with its /mcp URL and process. */
  async startHttp(token: string, extraArgs: string[] = [], env: Record<string, string> = {}): Promise<{url: URL; proc: ChildProcess}> {
    const portFile = path.join(this.dir, `mcp-port-${this.procs.length}`);
    const proc = this.spawn(process.execPath, [kCli, '--http', '--listen', '127.0.0.1:0', '--port-file', portFile, ...extraArgs],
                            {...this.sbxEnv, SBX_MCP_TOKEN: token, ...env});
    const port = await waitForFile(portFile, proc, () => this.log(proc));
    return {url: new URL(`http://127.0.0.1:${port}/mcp`), proc};
  }

  async cleanUp(): Promise<void> {
    // The server first, with SIGTERM: with --delete_sandboxes_on_exit it ends its sandboxes,
    // whose processes name no path of the dir (SIGKILL after 15 s).
    const server = this.procs[0];
    if (server && server.exitCode === null && server.signalCode === null) {
      const exited = new Promise<void>((resolve) => server.once('exit', () => resolve()));
      try { process.kill(server.pid!, 'SIGTERM'); } catch { /* gone */ }
      const timer = setTimeout(() => { try { process.kill(-server.pid!, 'SIGKILL'); } catch { /* gone */ } }, 15000);
      await exited;
      clearTimeout(timer);
    }
    for (const p of this.procs) {
      try { process.kill(-p.pid!, 'SIGKILL'); } catch { /* gone */ }
    }
    killProcessesNaming(this.dir);
    fs.rmSync(this.dir, {recursive: true, force: true});
  }
}

function killProcessesNaming(dir: string): void {
  const want = Buffer.from(`${dir}/`);
  for (let round = 0; round < 10; round++) {
    const pids: number[] = [];
    for (const entry of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
      try {
        // By its command line, or by its working folder: a sandbox's processes run in their
        // folder under the server's relative --sandbox_root and do not name the dir.
        if (fs.readFileSync(`/proc/${entry}/cmdline`).includes(want) ||
            `${fs.readlinkSync(`/proc/${entry}/cwd`)}/`.startsWith(`${dir}/`)) {
          pids.push(Number(entry));
        }
      } catch {
        // Gone, or not ours.
      }
    }
    if (pids.length === 0) return;
    for (const pid of pids) {
      try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
    }
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
  }
}

/** An MCP client on `sbx-mcp --stdio` (started by the transport, stderr collected). */
export async function stdioClient(world: World, extraArgs: string[] = [], env: Record<string, string> = {}): Promise<{client: McpClient; transport: StdioClientTransport; stderr: () => string}> {
  const transport = new StdioClientTransport({
    command: process.execPath, args: [kCli, '--stdio', ...extraArgs], cwd: world.dir,
    env: {...(process.env as Record<string, string>), ...world.sbxEnv, ...env}, stderr: 'pipe',
  });
  let stderr = '';
  transport.stderr?.on('data', (d: Buffer) => { stderr += d.toString(); });
  const client = new McpClient({name: 'sbx-mcp-test', version: '0'});
  await client.connect(transport);
  return {client, transport, stderr: () => stderr};
}

/** An MCP client on an HTTP sbx-mcp with a bearer token. */
export async function httpClient(url: URL, token: string): Promise<{client: McpClient; transport: StreamableHTTPClientTransport}> {
  const transport = new StreamableHTTPClientTransport(url, {requestInit: {headers: {authorization: `Bearer ${token}`}}});
  const client = new McpClient({name: 'sbx-mcp-test', version: '0'});
  await client.connect(transport);
  return {client, transport};
}

/** Calls a tool that must succeed; returns its JSON result. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function call(client: McpClient, name: string, args: Record<string, unknown>): Promise<any> {
  const r = (await client.callTool({name, arguments: args})) as CallToolResult;
  const text = (r.content[0] as {text: string}).text;
  assert.ok(!r.isError, `${name} failed: ${text}`);
  return JSON.parse(text);
}

/** Calls a tool that must fail; returns its error text. */
export async function callFails(client: McpClient, name: string, args: Record<string, unknown>): Promise<string> {
  const r = (await client.callTool({name, arguments: args})) as CallToolResult;
  const text = (r.content[0] as {text: string}).text;
  assert.equal(r.isError, true, `${name} should have failed, answered: ${text}`);
  return text;
}
