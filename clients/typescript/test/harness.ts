// Test harness: starts a real sbx-server on 127.0.0.1 (port 0, or a given port for
// restarts) in a fresh temp dir, and kills it and every process naming that dir (local
// sandboxes run in their own sessions) at the end.
//
// The binaries come from the environment, set by ctest (clients/typescript/CMakeLists.txt):
//   SBX_TEST_SERVER_BIN    sbx-server
//   SBX_TEST_SANDBOXD_BIN  sbx-sandboxd (local runtime only)
//   SBX_TEST_CONFIG        scripts/example-config.yaml (local runtime only)
import {spawn, type ChildProcess} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {setTimeout as sleep} from 'node:timers/promises';

export function requireEnv(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this test through ctest (ctest -R sdk.typescript)`);
  return v;
}

export interface ServerOptions {
  /** 'local' (real sandboxes, pool "default" of scripts/example-config.yaml) or 'instant'. */
  runtime: 'local' | 'instant';
  /** For instant: the config file's text (a pool and its template). */
  config?: string;
  /** Lines of an auth tokens file ('<token> <tenant> [admin]'); none: no auth. */
  tokens?: string[];
  /** Reuse a temp dir (a restart keeps the store and the sandboxes). */
  dir?: string;
  /** Listen on this port (a restart); default any. */
  port?: number;
  /** Kill local sandboxes when the server stops. Default true. */
  deleteSandboxesOnExit?: boolean;
  /** More server flags. */
  extraArgs?: string[];
}

export class TestServer {
  readonly dir: string;
  port = 0;
  private proc: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();
  log = '';

  constructor(private readonly opts: ServerOptions) {
    // Short and under /tmp: local sandboxes have unix sockets below it.
    this.dir = opts.dir ?? fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-ts-')));
  }

  get target(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    const portFile = path.join(this.dir, 'port');
    fs.rmSync(portFile, {force: true});
    const args = [`--listen=127.0.0.1:${this.opts.port ?? this.port ?? 0}`, '--metrics_listen=off',
      `--port_file=${portFile}`, '--data_dir=data', '--log_level=warn', '--shutdown_grace_seconds=2'];
    if (this.opts.runtime === 'local') {
      args.push(`--config=${requireEnv('SBX_TEST_CONFIG')}`, `--sandboxd=${requireEnv('SBX_TEST_SANDBOXD_BIN')}`,
                '--sandbox_root=sb');
      if (this.opts.deleteSandboxesOnExit ?? true) args.push('--delete_sandboxes_on_exit');
    } else {
      fs.writeFileSync(path.join(this.dir, 'config.yaml'), this.opts.config ?? '');
      args.push('--runtime=instant', '--config=config.yaml', '--refill_qps=100000');
    }
    if (this.opts.tokens) {
      fs.writeFileSync(path.join(this.dir, 'tokens'), this.opts.tokens.join('\n') + '\n');
      args.push('--auth_tokens_file=tokens');
    } else {
      args.push('--insecure_no_auth');
    }
    args.push(...(this.opts.extraArgs ?? []));
    const proc = spawn(requireEnv('SBX_TEST_SERVER_BIN'), args,
                       {cwd: this.dir, detached: true, stdio: ['ignore', 'pipe', 'pipe']});
    this.proc = proc;
    proc.stdout!.on('data', (d) => { this.log += d; });
    proc.stderr!.on('data', (d) => { this.log += d; });
    let exitedEarly = false;
    this.exited = new Promise((resolve) => proc.once('exit', () => { exitedEarly = true; resolve(); }));
    const deadline = Date.now() + 30000;
    while (Date.now() < deadline) {
      if (exitedEarly) throw new Error(`sbx-server exited before serving:\n${this.log}`);
      const text = fs.existsSync(portFile) ? fs.readFileSync(portFile, 'utf8').trim() : '';
      if (/^\d+$/.test(text)) {
        this.port = Number(text);
        return this;
      }
      await sleep(20);
    }
    throw new Error(`sbx-server did not write its port within 30 s:\n${this.log}`);
  }

  /** Stops the server: SIGTERM (graceful) or SIGKILL (a crash). */
  async stop(signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    try {
      process.kill(signal === 'SIGKILL' ? -proc.pid! : proc.pid!, signal);
    } catch {
      // Gone already.
    }
    const timer = setTimeout(() => { try { process.kill(-proc.pid!, 'SIGKILL'); } catch { /* gone */ } }, 15000);
    await this.exited;
    clearTimeout(timer);
  }

  /**
   * Stops the server (SIGTERM first: with --delete_sandboxes_on_exit it ends its sandboxes,
   * whose processes name no path of the dir; SIGKILL after 15 s), then everything that
   * names the dir or runs in it, and removes the dir.
   */
  async cleanUp(): Promise<void> {
    await this.stop('SIGTERM');
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
    // With their descendants: a sandbox's pid 1 (bubblewrap's child) would outlive its
    // parent's SIGKILL, reparented, in its own namespaces.
    for (const pid of withDescendants(pids)) {
      try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
    }
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
  }
}

/** Polls `cond` every 20 ms until it holds, or throws after `ms`. */
export async function waitFor(what: string, cond: () => Promise<boolean> | boolean, ms = 30000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(20);
  }
}

/** An instant-runtime config with one pool. */
export function instantConfig(pools: {name: string; warm: number; policy?: string; wait?: string; maxTtl?: string;
                                      selection?: string}[]): string {
  const lines = ['templates:', '  - {name: t, runtime: local, local: {network: false}}', 'pools:'];
  for (const p of pools) {
    lines.push(`  - {name: ${p.name}, template: t, min_warm: ${p.warm}, max_warm: ${p.warm}, ` +
               `empty_pool_policy: ${p.policy ?? 'wait'}, default_wait: ${p.wait ?? '10s'}` +
               (p.maxTtl ? `, max_ttl: ${p.maxTtl}` : '') +
               (p.selection ? `, selection_policy: ${p.selection}` : '') + '}');
  }
  return lines.join('\n') + '\n';
}

/** `pids` and every process below them (by /proc/PID/stat's parent pid). */
function withDescendants(pids: number[]): number[] {
  const children = new Map<number, number[]>();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // Gone.
    }
  }
  const out = new Set<number>();
  const stack = [...pids];
  while (stack.length > 0) {
    const pid = stack.pop()!;
    if (out.has(pid)) continue;
    out.add(pid);
    stack.push(...(children.get(pid) ?? []));
  }
  return [...out];
}
