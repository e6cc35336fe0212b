// Test harness of the E2B tests: a real sbx-server (local runtime, the pool "default" of
// scripts/example-config.yaml, two tenants) with its E2B front on 127.0.0.1 port 0, in a
// fresh temp dir; cleanUp() stops it and kills every process naming or running in that
// dir (local sandboxes run in sessions of their own).
//
// The binaries come from the environment, set by ctest (tests/e2b/CMakeLists.txt):
//   SBX_TEST_SERVER_BIN, SBX_TEST_SANDBOXD_BIN, SBX_TEST_CONFIG
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {setTimeout as sleep} from 'node:timers/promises';

export function requireEnv(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this test through ctest (ctest -R e2b)`);
  return v;
}

// The tenants of the tokens file: token -> tenant.
export const ALICE = 'e2b_alice_token_0123456789';
export const BOB = 'e2b_bob_token_9876543210';

export class TestServer {
  constructor({extraArgs = []} = {}) {
    this.extraArgs = extraArgs;
    // Short and under /tmp: local sandboxes have unix sockets below it.
    this.dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-e2b-')));
    this.log = '';
    this.grpcPort = 0;
    this.e2bPort = 0;
  }

  get url() {
    return `http://127.0.0.1:${this.e2bPort}`;
  }

  // Points the E2B SDK (read from the environment at every call) at this server, as alice.
  useFromE2b() {
    process.env.E2B_API_URL = this.url;
    process.env.E2B_SANDBOX_URL = this.url;
    process.env.E2B_API_KEY = ALICE;
    process.env.E2B_DOMAIN = 'sbx.localhost';
    delete process.env.E2B_DEBUG;
  }

  async start() {
    const tokens = path.join(this.dir, 'tokens');
    fs.writeFileSync(tokens, `${ALICE} alice\n${BOB} bob\n`);
    const args = ['--listen=127.0.0.1:0', '--port_file=port', '--metrics_listen=off',
      '--data_dir=data', '--log_level=warn', '--shutdown_grace_seconds=2',
      `--config=${requireEnv('SBX_TEST_CONFIG')}`, `--sandboxd=${requireEnv('SBX_TEST_SANDBOXD_BIN')}`,
      '--sandbox_root=sb', '--delete_sandboxes_on_exit', '--auth_tokens_file=tokens',
      '--e2b_listen=127.0.0.1:0', '--e2b_port_file=e2b_port', ...this.extraArgs];
    const proc = spawn(requireEnv('SBX_TEST_SERVER_BIN'), args,
                       {cwd: this.dir, detached: true, stdio: ['ignore', 'pipe', 'pipe']});
    this.proc = proc;
    proc.stdout.on('data', (d) => { this.log += d; });
    proc.stderr.on('data', (d) => { this.log += d; });
    let exitedEarly = false;
    this.exited = new Promise((resolve) => proc.once('exit', () => { exitedEarly = true; resolve(); }));
    const read = (f) => {
      const p = path.join(this.dir, f);
      const text = fs.existsSync(p) ? fs.readFileSync(p, 'utf8').trim() : '';
      return /^\d+$/.test(text) ? Number(text) : 0;
    };
    const deadline = Date.now() + 30000;
    while (Date.now() < deadline) {
      if (exitedEarly) throw new Error(`sbx-server exited before serving:\n${this.log}`);
      this.grpcPort = read('port');
      this.e2bPort = read('e2b_port');
      if (this.grpcPort && this.e2bPort) return this;
      await sleep(20);
    }
    throw new Error(`sbx-server did not write its ports within 30 s:\n${this.log}`);
  }

  async stop() {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    try { process.kill(proc.pid, 'SIGTERM'); } catch { /* gone */ }
    const timer = setTimeout(() => { try { process.kill(-proc.pid, 'SIGKILL'); } catch { /* gone */ } }, 15000);
    await this.exited;
    clearTimeout(timer);
  }

  async cleanUp() {
    await this.stop();
    killProcessesNaming(this.dir);
    fs.rmSync(this.dir, {recursive: true, force: true});
  }
}

function killProcessesNaming(dir) {
  const want = Buffer.from(`${dir}/`);
  for (let round = 0; round < 10; round++) {
    const pids = [];
    for (const entry of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
      try {
        if (fs.readFileSync(`/proc/${entry}/cmdline`).includes(want) ||
            `${fs.readlinkSync(`/proc/${entry}/cwd`)}/`.startsWith(`${dir}/`)) {
          pids.push(Number(entry));
        }
      } catch {
        // Gone, or not ours.
      }
    }
    if (pids.length === 0) return;
    for (const pid of withDescendants(pids)) {
      try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
    }
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
  }
}

function withDescendants(pids) {
  const children = new Map();
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
  const out = new Set();
  const stack = [...pids];
  while (stack.length > 0) {
    const pid = stack.pop();
    if (out.has(pid)) continue;
    out.add(pid);
    stack.push(...(children.get(pid) ?? []));
  }
  return [...out];
}

// The whole of an E2B list paginator.
export async function listAll(paginator) {
  const out = [];
  while (paginator.hasNext) out.push(...await paginator.nextItems());
  return out;
}
