// Options of sbx-mcp, from flags and the environment, with their defaults and checks.
import fs from 'node:fs';

import type {ClientOptions} from '@sbx/client';

/** Everything sbx-mcp is configured with. Defaults are in {@link defaultOptions}. */
export interface Options {
  /** Which transport: `stdio` (one session, the process's stdin/stdout) or `http`. */
  mode: 'stdio' | 'http';
  /** HTTP: host:port to listen on (port 0: any free port). */
  listen: string;
  /** HTTP: file the bound port is written to once listening (tests, scripts). */
  portFile: string;
  /** HTTP: the bearer token clients must send. From `$SBX_MCP_TOKEN` or `--token-file`. */
  token: string;
  /** Limit of characters (code points) in one tool result: command output, file text, listings. */
  maxOutputChars: number;
  /** HTTP: a session without requests for this long ends and its sandboxes are released. */
  idleTimeoutMs: number;
  /** HTTP: sessions at once; more are refused with 503. */
  maxSessions: number;
  /** Sandboxes one session may hold at once. */
  maxSandboxesPerSession: number;
  /** Pool of claim_sandbox when the call names none. */
  defaultPool: string;
  /** TTL of a claim when claim_sandbox gives none, so that a crashed sbx-mcp leaks nothing for long. */
  defaultTtl: string;
  /**
   * While a command runs, a progress notification this often (when the call carries a
   * progressToken), so that clients that reset their request timeout on progress wait.
   */
  progressIntervalMs: number;
  /** How to reach sbx (server, token, TLS), as @sbx/client takes it. */
  client: ClientOptions;
}

export function defaultOptions(): Options {
  return {
    mode: 'stdio', listen: '127.0.0.1:8765', portFile: '', token: '', maxOutputChars: 30000,
    idleTimeoutMs: 30 * 60 * 1000, maxSessions: 64, maxSandboxesPerSession: 8, defaultPool: 'default',
    defaultTtl: '1h', progressIntervalMs: 10000, client: {},
  };
}

export const kUsage = `usage: sbx-mcp (--stdio | --http [--listen HOST:PORT]) [options]

MCP server for sbx: tools to claim sandboxes, run commands and move files in them.

  --stdio                      serve one session on stdin/stdout (default)
  --http                       serve Streamable HTTP on /mcp; needs a token
  --listen HOST:PORT           HTTP address (default 127.0.0.1:8765; port 0: any)
  --port-file FILE             write the bound HTTP port there
  --token-file FILE            HTTP bearer token (default: $SBX_MCP_TOKEN)
  --max-output-chars N         characters per tool result (default 30000; $SBX_MCP_MAX_OUTPUT_CHARS)
  --idle-timeout DURATION      HTTP session idle timeout (default 30m; $SBX_MCP_IDLE_TIMEOUT)
  --max-sessions N             HTTP sessions at once (default 64)
  --max-sandboxes N            sandboxes per session (default 8)
  --default-pool NAME          pool when claim_sandbox names none (default "default")
  --default-ttl DURATION       claim TTL when claim_sandbox gives none (default 1h)
  --progress-interval DURATION progress notifications while a command runs (default 10s)
  --server HOST:PORT           sbx server (default $SBX_SERVER, else 127.0.0.1:50051)
  --tls                        TLS to sbx with the system's roots
  --ca FILE                    PEM roots for sbx (implies --tls; default $SBX_CA)
  --cert FILE --key FILE       client certificate for mutual TLS (default $SBX_CERT, $SBX_KEY)
  --tls-server-name NAME       name in sbx's certificate (default $SBX_TLS_SERVER_NAME)
The sbx tenant token comes from $SBX_TOKEN only (not a flag: flags show in ps).
`;

const kDurationUnitMs: Record<string, number> = {ms: 1, s: 1000, m: 60000, h: 3600000};

/** Milliseconds of "300ms", "30s", "10m", "1h30m"; throws naming the value otherwise. */
export function parseDuration(text: string, what: string): number {
  const re = /^(\d+(?:\.\d+)?)(ms|h|m|s)/;
  let rest = text.trim();
  let total = 0;
  if (rest === '') throw new Error(`${what} "${text}" is empty`);
  while (rest !== '') {
    const m = re.exec(rest);
    if (!m) throw new Error(`${what} "${text}" is not a duration like 300ms, 30s, 10m or 1h30m`);
    total += Number(m[1]) * kDurationUnitMs[m[2]!]!;
    rest = rest.slice(m[0].length);
  }
  return total;
}

function positiveInt(text: string, what: string): number {
  if (!/^\d+$/.test(text) || Number(text) < 1) throw new Error(`${what} "${text}" is not a positive integer`);
  return Number(text);
}

/**
 * Options from argv (without node and the script) and env. Throws an Error whose message
 * says which flag or variable is wrong; `--help` throws with the usage text.
 */
export function parseOptions(argv: string[], env: NodeJS.ProcessEnv): Options {
  const o = defaultOptions();
  let tokenFile = '';
  if (env.SBX_MCP_MAX_OUTPUT_CHARS) o.maxOutputChars = positiveInt(env.SBX_MCP_MAX_OUTPUT_CHARS, '$SBX_MCP_MAX_OUTPUT_CHARS');
  if (env.SBX_MCP_IDLE_TIMEOUT) o.idleTimeoutMs = parseDuration(env.SBX_MCP_IDLE_TIMEOUT, '$SBX_MCP_IDLE_TIMEOUT');
  const c: ClientOptions = {};
  if (env.SBX_CA) c.ca = env.SBX_CA;
  if (env.SBX_CERT) c.cert = env.SBX_CERT;
  if (env.SBX_KEY) c.key = env.SBX_KEY;
  if (env.SBX_TLS_SERVER_NAME) c.serverName = env.SBX_TLS_SERVER_NAME;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf('=');
    const flag = arg.startsWith('--') && eq > 0 ? arg.slice(0, eq) : arg;
    const value = (): string => {
      if (arg.startsWith('--') && eq > 0) return arg.slice(eq + 1);
      const v = argv[++i];
      if (v === undefined) throw new Error(`${flag} needs a value`);
      return v;
    };
    switch (flag) {
      case '--stdio': o.mode = 'stdio'; break;
      case '--http': o.mode = 'http'; break;
      case '--listen': o.listen = value(); break;
      case '--port-file': o.portFile = value(); break;
      case '--token-file': tokenFile = value(); break;
      case '--max-output-chars': o.maxOutputChars = positiveInt(value(), flag); break;
      case '--idle-timeout': o.idleTimeoutMs = parseDuration(value(), flag); break;
      case '--max-sessions': o.maxSessions = positiveInt(value(), flag); break;
      case '--max-sandboxes': o.maxSandboxesPerSession = positiveInt(value(), flag); break;
      case '--default-pool': o.defaultPool = value(); break;
      case '--default-ttl': o.defaultTtl = value(); parseDuration(o.defaultTtl, flag); break;
      case '--progress-interval': o.progressIntervalMs = parseDuration(value(), flag); break;
      case '--server': c.server = value(); break;
      case '--tls': c.tls = true; break;
      case '--ca': c.ca = value(); break;
      case '--cert': c.cert = value(); break;
      case '--key': c.key = value(); break;
      case '--tls-server-name': c.serverName = value(); break;
      case '-h': case '--help': throw new Error(kUsage);
      default: throw new Error(`unknown argument "${arg}"\n${kUsage}`);
    }
  }
  o.client = c;
  if (tokenFile) {
    try {
      o.token = (fs.readFileSync(tokenFile, 'utf8').split('\n')[0] ?? '').trim();
    } catch (e) {
      throw new Error(`--token-file "${tokenFile}" cannot be read: ${(e as Error).message}`);
    }
    if (!o.token) throw new Error(`--token-file "${tokenFile}" is empty`);
  } else {
    o.token = (env.SBX_MCP_TOKEN ?? '').trim();
  }
  validate(o);
  return o;
}

/** Throws when the options cannot work together. */
export function validate(o: Options): void {
  if (o.mode === 'http') {
    if (!o.token) {
      throw new Error('--http needs a bearer token for its clients: set $SBX_MCP_TOKEN or --token-file ' +
                      '(sbx-mcp refuses to serve HTTP without one)');
    }
    if (o.token.length < 16) throw new Error('the HTTP bearer token is shorter than 16 characters');
    if (!/^[^:\s]+:\d+$/.test(o.listen) && !/^\[[^\]]+\]:\d+$/.test(o.listen)) {
      throw new Error(`--listen "${o.listen}" is not HOST:PORT`);
    }
  }
  if (o.idleTimeoutMs < 1000) throw new Error(`--idle-timeout ${o.idleTimeoutMs} ms is below 1s`);
  if (o.progressIntervalMs < 100) throw new Error(`--progress-interval ${o.progressIntervalMs} ms is below 100ms`);
  if (o.maxOutputChars < 100) throw new Error(`--max-output-chars ${o.maxOutputChars} is below 100`);
}
