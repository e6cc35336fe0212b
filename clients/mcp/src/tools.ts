// The MCP server of one session: the tools and the sbx://sandboxes resource, on top of a
// SandboxSession. Every tool answers one text block holding a JSON object; failures are
// tool errors (isError: true) whose text names the problem.
import {McpServer} from '@modelcontextprotocol/sdk/server/mcp.js';
import type {CallToolResult, ServerNotification} from '@modelcontextprotocol/sdk/types.js';
import {PoolExhausted, SbxError, type FileInfo} from '@sbx/client';
import {z} from 'zod';

import {base64Bytes, boundLines, boundOutput, utf8PrefixBytes} from './limits.js';
import type {Options} from './options.js';
import {type OwnedSandbox, type SandboxSession, ToolError} from './session.js';

export const kVersion = '0.1.0';
/** Default and largest run_command timeout, seconds. */
export const kDefaultCommandTimeoutS = 60;
export const kMaxCommandTimeoutS = 600;
/** Largest file read_file reads (it reads whole files, then bounds the result). */
export const kMaxReadFileBytes = 16 * 1024 * 1024;

const kSandboxArg = z.string().min(1).describe('The sandbox id that claim_sandbox returned (its claim id).');
const kDuration = /^(\d+(\.\d+)?(ms|h|m|s))+$/;

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
        'read_file and list_files use it (paths are relative to the sandbox workspace); release_sandbox ' +
        `when done. Tool results are cut at ${limit} characters.`,
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

  server.registerTool('list_sandboxes', {
    title: 'List this session\'s sandboxes',
    description: 'The sandboxes this session holds (as the sbx://sandboxes resource).',
    inputSchema: {},
    annotations: {readOnlyHint: true, openWorldHint: false},
  }, run('list_sandboxes', async () => ({sandboxes: session.list().map(describe)})));

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

