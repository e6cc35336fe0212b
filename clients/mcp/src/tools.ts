// The MCP server of one session: the tools and the sbx://sandboxes resource, on top of a
// SandboxSession. Every tool answers one text block holding a JSON object; failures are
// tool errors (isError: true) whose text names the problem.
import {McpServer} from '@modelcontextprotocol/sdk/server/mcp.js';
import type {CallToolResult, ServerNotification} from '@modelcontextprotocol/sdk/types.js';
import {
  FailedPrecondition, PoolExhausted, SbxError, type FileInfo, type ProcessExit, type ProcessRef, type SandboxProcess,
  type Snapshot,
} from '@sbx/client';
import {z} from 'zod';

import {base64Bytes, boundLines, boundOutput, HeadTail, utf8PrefixBytes} from './limits.js';
import type {Options} from './options.js';
import {type OwnedSandbox, type SandboxSession, ToolError} from './session.js';

export const kVersion = '0.1.0';
/** Default and largest run_command timeout, seconds. */
export const kDefaultCommandTimeoutS = 60;
export const kMaxCommandTimeoutS = 600;
/** Largest file read_file reads (it reads whole files, then bounds the result). */
export const kMaxReadFileBytes = 16 * 1024 * 1024;
/** Largest read_process_output wait and stop_process grace, seconds. */
export const kMaxReadWaitS = 30;
export const kMaxStopGraceS = 60;
/** How long read_process_output keeps reading what the process wrote before the call, at most, ms. */
const kReplayReadMs = 5000;

const kSandboxArg = z.string().min(1).describe('The sandbox id that claim_sandbox returned (its claim id).');
const kDuration = /^(\d+(\.\d+)?(ms|h|m|s))+$/;
const kProcessArg = z.union([z.number().int().positive(), z.string().min(1)])
    .describe('The process: its pid (a number) or the tag given to start_process (a string).');

function ok(value: Record<string, unknown>): CallToolResult {
  return {content: [{type: 'text', text: JSON.stringify(value, null, 2)}]};
}

/** A tool error for anything a tool throws: SbxError codes get a hint of what to do. */
export function toolError(tool: string, e: unknown): CallToolResult {
  let text: string;
  if (e instanceof ToolError) {
    text = `${e.code}: ${e.message}`;
  } else if (e instanceof SbxError) {
    const hints: Record<string, string> = {
      NOT_FOUND: '',
      RESOURCE_EXHAUSTED: e instanceof PoolExhausted ?
          ` (the pool has no free sandbox${e.retryAfterMs !== undefined ? `; retry in ${e.retryAfterMs} ms` : ''})` : '',
      DEADLINE_EXCEEDED: ' (no answer in time; for claim_sandbox: no sandbox became free within the wait)',
      FAILED_PRECONDITION: ' (the sandbox cannot do this now, e.g. its claim has ended or expired)',
      UNAVAILABLE: ' (the sbx server is unreachable; retry later)',
      UNAUTHENTICATED: ' (sbx-mcp\'s $SBX_TOKEN was refused by the sbx server: an operator must fix it)',
      PERMISSION_DENIED: ' (sbx-mcp\'s sbx token may not do this)',
    };
    text = `${e.code}: ${e.details}${hints[e.code] ?? ''}`;
  } else {
    text = `INTERNAL: ${(e as Error)?.message ?? String(e)}`;
  }
  return {isError: true, content: [{type: 'text', text: `${tool} failed: ${text}`}]};
}

function describe(o: OwnedSandbox): Record<string, unknown> {
  return {
    sandbox: o.sandbox.claimId, pool: o.pool, claimed_at: o.claimedAt.toISOString(),
    expires_at: o.expiresAt?.toISOString() ?? null,
  };
}

function describeSnapshot(s: Snapshot): Record<string, unknown> {
  return {snapshot: s.id, name: s.name || null, size_bytes: s.sizeBytes, created_at: s.createdAt?.toISOString() ?? null};
}

function fileLine(f: FileInfo): string {
  const type = {file: 'f', directory: 'd', symlink: 'l', other: '?'}[f.type];
  return `${type} ${f.size} ${f.path}${f.type === 'directory' ? '/' : ''}`;
}

function parseMode(mode: string | undefined): number | undefined {
  if (mode === undefined) return undefined;
  if (!/^[0-7]{3,4}$/.test(mode)) throw new ToolError('INVALID_ARGUMENT', `mode "${mode}" is not octal like "644" or "0755"`);
  return parseInt(mode, 8);
}

/** Creates the MCP server of one session. Connect it to that session's transport. */
export function createMcpServer(session: SandboxSession, options: Options): McpServer {
  const limit = options.maxOutputChars;
  const server = new McpServer({name: 'sbx-mcp', version: kVersion}, {
    instructions: 'Sandboxes from sbx warm pools: claim_sandbox gives a sandbox id; run_command, write_file, ' +
        'read_file and list_files use it (paths are relative to the sandbox workspace); start_process, ' +
        'read_process_output and stop_process run background processes, get_port_url reaches their ports; ' +
        'snapshot_sandbox saves a sandbox\'s files, reset_sandbox rewinds it to them, fork_sandbox makes copies; ' +
        `release_sandbox when done. Tool results are cut at ${limit} characters.`,
  });

  // Every handler goes through here: errors become tool errors.
  const run = <A>(tool: string, fn: (args: A, extra: Extra) => Promise<Record<string, unknown>>) =>
    async (args: A, extra: Extra): Promise<CallToolResult> => {
      try {
        return ok(await fn(args, extra));
      } catch (e) {
        return toolError(tool, e);
      }
    };

  server.registerTool('claim_sandbox', {
    title: 'Claim a sandbox',
    description: 'Claims a fresh, isolated sandbox (Linux, a workspace directory, no network unless the pool ' +
        'allows it) from an sbx warm pool. Returns its id for the other tools. It is this session\'s alone and ' +
        'is released when the session ends or its ttl passes.',
    inputSchema: {
      pool: z.string().min(1).optional().describe(`Warm pool to claim from. Default "${options.defaultPool}".`),
      ttl: z.string().regex(kDuration).optional()
          .describe(`How long the sandbox lives without renew_sandbox, e.g. "30m", "2h". Default "${options.defaultTtl}"; the pool may cap it.`),
      env: z.record(z.string()).optional().describe('Environment variables for every command run in the sandbox.'),
      files: z.record(z.string()).optional()
          .describe('Text files to place in the workspace before it is returned: {"path/relative.txt": "content"} (1 MiB in total).'),
    },
    annotations: {destructiveHint: false, openWorldHint: false},
  }, run('claim_sandbox', async (a: {pool?: string; ttl?: string; env?: Record<string, string>; files?: Record<string, string>}) => {
    const pool = a.pool ?? options.defaultPool;
    const owned = await session.claim(pool, {ttl: a.ttl ?? options.defaultTtl, env: a.env, files: a.files});
    return {...describe(owned), workspace: 'paths in the other tools are relative to the workspace, the commands\' default cwd'};
  }));

  server.registerTool('run_command', {
    title: 'Run a command',
    description: 'Runs a shell command (sh -c) in one of this session\'s sandboxes and waits for it. Returns exit_code ' +
        `(null when killed), stdout and stderr. Output beyond ${limit} characters (stdout and stderr together) is cut ` +
        'in the middle of each cut stream, with truncated: true and the full byte counts. A non-zero exit is not a tool error.',
    inputSchema: {
      sandbox: kSandboxArg,
      command: z.string().min(1).describe('Shell command, run as `sh -c COMMAND`, e.g. "pip list | head".'),
      cwd: z.string().optional().describe('Working directory relative to the workspace. Default: the workspace.'),
      timeout: z.number().positive().max(kMaxCommandTimeoutS).optional()
          .describe(`Seconds before the command is killed (SIGKILL). Default ${kDefaultCommandTimeoutS}, at most ${kMaxCommandTimeoutS}.`),
      env: z.record(z.string()).optional().describe('Extra environment variables for this command.'),
      stdin: z.string().optional().describe('Text for the command\'s stdin. Default: none (/dev/null).'),
    },
    annotations: {destructiveHint: true, openWorldHint: false},
  }, run('run_command', async (a: {sandbox: string; command: string; cwd?: string; timeout?: number; env?: Record<string, string>; stdin?: string}, extra) => {
    const {sandbox} = session.get(a.sandbox);
    const timeoutS = a.timeout ?? kDefaultCommandTimeoutS;
    const stopProgress = reportProgress(extra, options.progressIntervalMs, timeoutS);
    let r;
    try {
      r = await sandbox.exec(a.command, {cwd: a.cwd, env: a.env, stdin: a.stdin, timeout: Math.round(timeoutS * 1000),
                                         signal: extra.signal});
    } finally {
      stopProgress();
    }
    const out = boundOutput(r.stdout, r.stderr, limit);
    return {
      exit_code: r.exitCode, signal: r.signal, timed_out: r.timedOut, stdout: out.stdout, stderr: out.stderr,
      truncated: out.truncated || r.truncated, stdout_bytes: r.stdoutBytes, stderr_bytes: r.stderrBytes,
      duration_ms: Math.round(r.durationMs),
    };
  }));

  server.registerTool('write_file', {
    title: 'Write a file',
    description: 'Writes (replaces, or appends to) a file in one of this session\'s sandboxes, creating missing directories.',
    inputSchema: {
      sandbox: kSandboxArg,
      path: z.string().min(1).describe('Path relative to the workspace, e.g. "src/main.py".'),
      content: z.string().describe('The content: text, or base64 when encoding is "base64".'),
      encoding: z.enum(['text', 'base64']).optional().describe('How content is given. Default "text" (UTF-8).'),
      append: z.boolean().optional().describe('Append instead of replacing. Default false.'),
      mode: z.string().optional().describe('Octal permissions of a new file, e.g. "755". Default "644".'),
    },
    annotations: {destructiveHint: true, openWorldHint: false},
  }, run('write_file', async (a: {sandbox: string; path: string; content: string; encoding?: 'text' | 'base64'; append?: boolean; mode?: string}) => {
    const {sandbox} = session.get(a.sandbox);
    const data = a.encoding === 'base64' ? Buffer.from(a.content, 'base64') : Buffer.from(a.content, 'utf8');
    const size = await sandbox.files.write(a.path, data, {append: a.append, mode: parseMode(a.mode)});
    return {path: a.path, written_bytes: data.length, size};
  }));

  server.registerTool('read_file', {
    title: 'Read a file',
    description: `Reads a file of one of this session's sandboxes from a byte offset: as text (UTF-8, at most ${limit} ` +
        `characters) or base64 (at most ${base64Bytes(limit)} bytes). When more remains, truncated is true and ` +
        'next_offset is the offset to continue from.',
    inputSchema: {
      sandbox: kSandboxArg,
      path: z.string().min(1).describe('Path relative to the workspace.'),
      encoding: z.enum(['text', 'base64']).optional().describe('"text" (default) or "base64" for binary files.'),
      offset: z.number().int().min(0).optional().describe('Byte offset to start at (a previous next_offset). Default 0.'),
    },
    annotations: {readOnlyHint: true, openWorldHint: false},
  }, run('read_file', async (a: {sandbox: string; path: string; encoding?: 'text' | 'base64'; offset?: number}) => {
    const {sandbox} = session.get(a.sandbox);
    await checkReadable(sandbox.files, a.path);
    const data = await sandbox.files.read(a.path);
    const offset = Math.min(a.offset ?? 0, data.length);
    const rest = data.subarray(offset);
    const take = a.encoding === 'base64' ? Math.min(rest.length, base64Bytes(limit)) : utf8PrefixBytes(rest, limit);
    const part = rest.subarray(0, take);
    const truncated = take < rest.length;
    return {
      path: a.path, size: data.length, offset, encoding: a.encoding ?? 'text',
      content: a.encoding === 'base64' ? part.toString('base64') : part.toString('utf8'),
      bytes: take, truncated, next_offset: truncated ? offset + take : null,
    };
  }));

  server.registerTool('list_files', {
    title: 'List files',
    description: 'Lists a directory of one of this session\'s sandboxes, one line per entry: "TYPE SIZE PATH" with ' +
        `TYPE f (file), d (directory, PATH ends with /), l (symlink) or ?. At most ${limit} characters of whole lines; ` +
        'truncated and total_entries say when some were left out.',
    inputSchema: {
      sandbox: kSandboxArg,
      path: z.string().optional().describe('Directory relative to the workspace. Default: the workspace itself.'),
      recursive: z.boolean().optional().describe('Everything below the directory. Default false.'),
    },
    annotations: {readOnlyHint: true, openWorldHint: false},
  }, run('list_files', async (a: {sandbox: string; path?: string; recursive?: boolean}) => {
    const {sandbox} = session.get(a.sandbox);
    const files = await sandbox.files.list(a.path ?? '', {recursive: a.recursive});
    const lines = files.map(fileLine);
    const shown = boundLines(lines, limit);
    return {
      path: a.path ?? '', entries: shown.text, shown_entries: shown.shown, total_entries: lines.length,
      truncated: shown.shown < lines.length,
    };
  }));

  server.registerTool('start_process', {
    title: 'Start a background process',
    description: 'Starts a shell command (sh -c) in the background in one of this session\'s sandboxes (a dev ' +
        'server, a watcher, a long job) and returns at once with its pid. It runs on after this call, until it ' +
        'ends, stop_process, or the sandbox\'s release. Its output waits (the last 1 MiB) for read_process_output. ' +
        'A tag names it for the other process tools. To reach a server it starts, use get_port_url.',
    inputSchema: {
      sandbox: kSandboxArg,
      command: z.string().min(1).describe('Shell command, run as `sh -c COMMAND`, e.g. "python3 -m http.server 8000".'),
      tag: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/).optional()
          .describe('A name for it, 1-64 of A-Z a-z 0-9 . _ -, unique among the sandbox\'s running processes.'),
      cwd: z.string().optional().describe('Working directory relative to the workspace. Default: the workspace.'),
      env: z.record(z.string()).optional().describe('Extra environment variables.'),
    },
    annotations: {destructiveHint: true, openWorldHint: false},
  }, run('start_process', async (a: {sandbox: string; command: string; tag?: string; cwd?: string; env?: Record<string, string>}) => {
    const {sandbox} = session.get(a.sandbox);
    const p = await sandbox.processes.start(a.command, {tag: a.tag, cwd: a.cwd, env: a.env});
    return {pid: p.pid, tag: p.tag || null, started_at: p.startedAt?.toISOString() ?? null};
  }));

  server.registerTool('read_process_output', {
    title: 'Read a background process\'s output',
    description: 'Reads what a process of start_process wrote since the last read_process_output (each byte is ' +
        'returned once), waiting up to `wait` seconds for more unless it ends first. Returns stdout, stderr, whether ' +
        `it still runs, and its exit_code once ended. Output beyond ${limit} characters is cut in the middle of each ` +
        'cut stream (truncated: true, with the full byte counts); dropped_bytes counts output lost because more than ' +
        '1 MiB waited unread.',
    inputSchema: {
      sandbox: kSandboxArg,
      process: kProcessArg,
      wait: z.number().min(0).max(kMaxReadWaitS).optional()
          .describe(`Seconds to wait for more output. Default 0 (what is there now), at most ${kMaxReadWaitS}.`),
    },
    annotations: {readOnlyHint: true, openWorldHint: false},
  }, run('read_process_output', async (a: {sandbox: string; process: ProcessRef; wait?: number}, extra) => {
    const {sandbox} = session.get(a.sandbox);
    const waitMs = Math.round((a.wait ?? 0) * 1000);
    // What waits in its replay buffer now: read at least that much (it arrives first).
    const all = await sandbox.processes.list({signal: extra.signal});
    const named = all.filter((p) => (typeof a.process === 'number' ? p.pid === a.process : p.tag === a.process));
    const pending = (named.find((p) => p.exit === null) ?? named[named.length - 1])?.bufferedBytes ?? 0;
    const proc: SandboxProcess = await sandbox.processes.connect(a.process, {signal: extra.signal});
    const keep = limit * 4;  // bytes: enough for `limit` characters of any UTF-8
    const out = new HeadTail(keep);
    const err = new HeadTail(keep);
    let dropped = 0;
    const started = Date.now();
    const timer = setTimeout(() => proc.detach(), waitMs + kReplayReadMs);
    const onAbort = () => proc.detach();
    extra.signal.addEventListener('abort', onAbort, {once: true});
    let waitTimer: NodeJS.Timeout | undefined;
    try {
      // Stops once the replay is in and `wait` has passed (or at the end of the process).
      let stopped = false;
      const stop = () => {
        stopped = true;
        proc.detach();
      };
      const maybeStop = () => {
        if (out.total + err.total < pending) return;
        const left = waitMs - (Date.now() - started);
        if (left <= 0) stop();
        else if (!waitTimer) waitTimer = setTimeout(stop, left);
      };
      maybeStop();
      // (Iterating a detached handle would connect again: not once stopped.)
      if (!stopped) {
        for await (const o of proc) {
          if (o.stream === 'dropped') dropped += o.dropped;
          else (o.stream === 'stderr' ? err : out).add(o.data);
          maybeStop();
          if (stopped) break;
        }
      }
    } finally {
      clearTimeout(timer);
      if (waitTimer) clearTimeout(waitTimer);
      extra.signal.removeEventListener('abort', onAbort);
      proc.detach();
    }
    const b = boundOutput(out.text(), err.text(), limit);
    const exit: ProcessExit | null = proc.exitStatus;
    return {
      pid: proc.pid, tag: proc.tag || null, running: exit === null, exit_code: exit?.exitCode ?? null,
      signal: exit?.signal ?? null, stdout: b.stdout, stderr: b.stderr,
      truncated: b.truncated || out.cut || err.cut, stdout_bytes: out.total, stderr_bytes: err.total,
      dropped_bytes: dropped,
    };
  }));

  server.registerTool('stop_process', {
    title: 'Stop a background process',
    description: 'Stops a process of one of this session\'s sandboxes: sends it `signal` (default TERM), waits up ' +
        'to `grace` seconds for it to end, then kills it (KILL). Returns how it ended. A process that has already ' +
        'ended is not an error: its exit is returned.',
    inputSchema: {
      sandbox: kSandboxArg,
      process: kProcessArg,
      signal: z.enum(['TERM', 'INT', 'HUP', 'KILL']).optional().describe('The first signal. Default "TERM".'),
      grace: z.number().min(0).max(kMaxStopGraceS).optional()
          .describe(`Seconds to wait after it before KILL. Default 5, at most ${kMaxStopGraceS}.`),
    },
    annotations: {destructiveHint: true, idempotentHint: true, openWorldHint: false},
  }, run('stop_process', async (a: {sandbox: string; process: ProcessRef; signal?: 'TERM' | 'INT' | 'HUP' | 'KILL'; grace?: number}, extra) => {
    const {sandbox} = session.get(a.sandbox);
    const sig = a.signal ?? 'TERM';
    let killed = false;
    const signal = async (s: 'TERM' | 'INT' | 'HUP' | 'KILL'): Promise<boolean> => {
      try {
        await sandbox.processes.kill(a.process, `SIG${s}`, {signal: extra.signal});
        return true;
      } catch (e) {
        if (e instanceof FailedPrecondition) return false;  // it has ended: its exit follows
        throw e;
      }
    };
    const sent = await signal(sig);
    let exit: ProcessExit;
    try {
      exit = await sandbox.processes.wait(a.process, {timeoutMs: Math.round((a.grace ?? 5) * 1000), signal: extra.signal});
    } catch (e) {
      if (!(e instanceof SbxError && e.code === 'DEADLINE_EXCEEDED') || sig === 'KILL') throw e;
      killed = await signal('KILL');
      exit = await sandbox.processes.wait(a.process, {timeoutMs: 30000, signal: extra.signal});
    }
    return {process: a.process, signal_sent: sent ? sig : null, killed, exit_code: exit.exitCode, signal: exit.signal};
  }));

  server.registerTool('list_processes', {
    title: 'List processes',
    description: 'The processes started in one of this session\'s sandboxes (running, and ended ones still kept), ' +
        `one line each: "PID TAG STATE COMMAND". At most ${limit} characters of whole lines.`,
    inputSchema: {sandbox: kSandboxArg},
    annotations: {readOnlyHint: true, openWorldHint: false},
  }, run('list_processes', async (a: {sandbox: string}) => {
    const {sandbox} = session.get(a.sandbox);
    const all = await sandbox.processes.list();
    const lines = all.map((p) => {
      const state = p.exit === null ? 'running' : p.exit.exitCode !== null ? `exited(${p.exit.exitCode})` : `killed(${p.exit.signal})`;
      return `${p.pid} ${p.tag || '-'} ${state} ${p.argv.join(' ')}`;
    });
    const shown = boundLines(lines, limit);
    return {processes: shown.text, shown: shown.shown, total: lines.length, truncated: shown.shown < lines.length};
  }));

  server.registerTool('get_port_url', {
    title: 'Get a URL for a port',
    description: 'A URL at which a TCP port inside one of this session\'s sandboxes (e.g. a web server of ' +
        'start_process listening on 127.0.0.1:PORT) is reachable from outside through the sbx server, for anyone ' +
        'holding the URL until it expires. Fails when the sbx server runs no port proxy.',
    inputSchema: {
      sandbox: kSandboxArg,
      port: z.number().int().min(1).max(65535).describe('The port inside the sandbox, e.g. 8000.'),
      ttl: z.string().regex(kDuration).optional().describe('How long the URL works, e.g. "30m". Default "1h", at most "168h".'),
    },
    annotations: {readOnlyHint: true, openWorldHint: false},
  }, run('get_port_url', async (a: {sandbox: string; port: number; ttl?: string}) => {
    const {sandbox} = session.get(a.sandbox);
    const u = await sandbox.url(a.port, {ttl: a.ttl});
    return {port: a.port, url: u.url, host_url: u.hostUrl || null, expires_at: u.expiresAt?.toISOString() ?? null};
  }));

  server.registerTool('release_sandbox', {
    title: 'Release a sandbox',
    description: 'Releases one of this session\'s sandboxes: it is destroyed with its files. Do it when done.',
    inputSchema: {sandbox: kSandboxArg},
    annotations: {destructiveHint: true, idempotentHint: true, openWorldHint: false},
  }, run('release_sandbox', async (a: {sandbox: string}) => {
    const state = await session.release(a.sandbox);
    return {sandbox: a.sandbox, state};
  }));

  server.registerTool('renew_sandbox', {
    title: 'Renew a sandbox',
    description: 'Extends the life of one of this session\'s sandboxes: it then expires ttl from now.',
    inputSchema: {
      sandbox: kSandboxArg,
      ttl: z.string().regex(kDuration).optional()
          .describe(`New lifetime from now, e.g. "30m". Default "${options.defaultTtl}"; the pool may cap it.`),
    },
    annotations: {idempotentHint: true, openWorldHint: false},
  }, run('renew_sandbox', async (a: {sandbox: string; ttl?: string}) => {
    const owned = session.get(a.sandbox);
    const claim = await owned.sandbox.renew(a.ttl ?? options.defaultTtl);
    owned.expiresAt = claim.expiresAt;
    return describe(owned);
  }));

  server.registerTool('snapshot_sandbox', {
    title: 'Snapshot a sandbox',
    description: 'Saves the files of one of this session\'s sandboxes (its whole file system: the workspace and ' +
        'what commands changed outside it; not its running processes) as a snapshot, and returns the snapshot id. ' +
        'Use it as a checkpoint before risky steps: reset_sandbox rewinds the sandbox to it, fork_sandbox starts ' +
        'copies from it. The sandbox keeps running. Snapshots are this session\'s and are deleted when it ends.',
    inputSchema: {
      sandbox: kSandboxArg,
      name: z.string().max(128).optional().describe('A name to remember it by, e.g. "deps-installed".'),
    },
    annotations: {destructiveHint: false, openWorldHint: false},
  }, run('snapshot_sandbox', async (a: {sandbox: string; name?: string}) => {
    const snap = await session.snapshot(a.sandbox, a.name);
    return {...describeSnapshot(snap), sandbox: a.sandbox};
  }));

  server.registerTool('reset_sandbox', {
    title: 'Reset a sandbox to a snapshot',
    description: 'Rewinds one of this session\'s sandboxes to a snapshot of this session (snapshot_sandbox): its ' +
        'files become the snapshot\'s again and every process in it is killed (background processes too). The ' +
        'sandbox id stays the same. Use it to undo changes or to start a new attempt from a checkpoint. The ' +
        'snapshot must come from a sandbox of the same pool image.',
    inputSchema: {
      sandbox: kSandboxArg,
      snapshot: z.string().min(1).describe('The snapshot id that snapshot_sandbox or fork_sandbox returned ("sn-...").'),
    },
    annotations: {destructiveHint: true, idempotentHint: true, openWorldHint: false},
  }, run('reset_sandbox', async (a: {sandbox: string; snapshot: string}) => {
    await session.reset(a.sandbox, a.snapshot);
    return {sandbox: a.sandbox, snapshot: a.snapshot, reset: true};
  }));

  server.registerTool('fork_sandbox', {
    title: 'Fork sandboxes from a snapshot',
    description: 'Makes `count` new sandboxes that start with the files of a snapshot of this session, or of one ' +
        'of this session\'s sandboxes as it is now (then snapshotted first; the snapshot id is returned). Each fork ' +
        'then changes only its own files. Use it to try several approaches from the same state in parallel. ' +
        'The forks are this session\'s sandboxes (they count against its limit): release them when done.',
    inputSchema: {
      snapshot: z.string().min(1).optional().describe('Fork this snapshot of the session ("sn-..."). Give this or sandbox.'),
      sandbox: z.string().min(1).optional().describe('Or fork this sandbox of the session as it is now.'),
      count: z.number().int().min(1).max(options.maxSandboxesPerSession)
          .describe(`How many forks, 1 to ${options.maxSandboxesPerSession} (the session's limit, with the sandboxes it holds).`),
      ttl: z.string().regex(kDuration).optional()
          .describe(`How long each fork lives without renew_sandbox, e.g. "30m". Default "${options.defaultTtl}".`),
    },
    annotations: {destructiveHint: false, openWorldHint: false},
  }, run('fork_sandbox', async (a: {snapshot?: string; sandbox?: string; count: number; ttl?: string}) => {
    if ((a.snapshot === undefined) === (a.sandbox === undefined)) {
      throw new ToolError('INVALID_ARGUMENT', 'give either snapshot or sandbox (the source of the forks), not both or neither');
    }
    const r = await session.fork({snapshot: a.snapshot, sandbox: a.sandbox}, a.count, {ttl: a.ttl ?? options.defaultTtl});
    return {snapshot: r.snapshotId, sandboxes: r.forks.map(describe)};
  }));

  server.registerTool('list_sandboxes', {
    title: 'List this session\'s sandboxes',
    description: 'The sandboxes this session holds (as the sbx://sandboxes resource), and its snapshots.',
    inputSchema: {},
    annotations: {readOnlyHint: true, openWorldHint: false},
  }, run('list_sandboxes', async () => ({
    sandboxes: session.list().map(describe), snapshots: session.listSnapshots().map(describeSnapshot),
  })));

  server.registerResource('sandboxes', 'sbx://sandboxes', {
    title: 'This session\'s sandboxes',
    description: 'JSON: the sandboxes this MCP session holds, with pool and expiry.',
    mimeType: 'application/json',
  }, async (uri) => ({
    contents: [{uri: uri.href, mimeType: 'application/json', text: JSON.stringify({sandboxes: session.list().map(describe)}, null, 2)}],
  }));

  return server;
}

/** What tool handlers use of the SDK's RequestHandlerExtra. */
interface Extra {
  signal: AbortSignal;
  _meta?: {progressToken?: string | number};
  sendNotification: (n: ServerNotification) => Promise<void>;
}

/**
 * Sends notifications/progress every `everyMs` (progress: seconds so far, total: the
 * timeout) when the call asked for progress; returns the function that stops it.
 */
function reportProgress(extra: Extra, everyMs: number, timeoutS: number): () => void {
  const token = extra._meta?.progressToken;
  if (token === undefined) return () => {};
  let ticks = 0;
  const timer = setInterval(() => {
    // Progress must grow with each notification: the ticks' seconds, not the clock's.
    const elapsed = (++ticks * everyMs) / 1000;
    extra.sendNotification({method: 'notifications/progress', params: {
      progressToken: token, progress: elapsed, total: timeoutS, message: `command running for ${elapsed} s`,
    }}).catch(() => {});  // The client went away; the command's own call ends too.
  }, everyMs);
  return () => clearInterval(timer);
}

/** Refuses files above kMaxReadFileBytes before reading them whole. */
async function checkReadable(files: OwnedSandbox['sandbox']['files'], path: string): Promise<void> {
  const slash = path.lastIndexOf('/');
  const dir = slash < 0 ? '' : path.slice(0, slash);
  let entries: FileInfo[];
  try {
    entries = await files.list(dir);
  } catch {
    return;  // Let the read say what is wrong.
  }
  const entry = entries.find((f) => f.path === path);
  if (entry && entry.type === 'file' && entry.size > kMaxReadFileBytes) {
    throw new ToolError('RESOURCE_EXHAUSTED', `file "${path}" has ${entry.size} bytes, more than read_file reads ` +
                        `(${kMaxReadFileBytes}); use run_command with head -c, tail -c or grep`);
  }
}

