// Streamable HTTP serving: one McpServer and SandboxSession per MCP session (the
// mcp-session-id header), behind a bearer token. A session ends, releasing its sandboxes,
// on DELETE, after idleTimeoutMs without requests, or at shutdown.
import {createHash, randomUUID, timingSafeEqual} from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import type {AddressInfo} from 'node:net';

import type {McpServer} from '@modelcontextprotocol/sdk/server/mcp.js';
import {StreamableHTTPServerTransport} from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import {isInitializeRequest} from '@modelcontextprotocol/sdk/types.js';
import type {Client} from '@sbx/client';

import type {Options} from './options.js';
import {SandboxSession} from './session.js';
import {createMcpServer} from './tools.js';

/** Largest request body read (write_file of a 1 MiB file as base64 is about 1.4 MB). */
const kMaxBodyBytes = 8 * 1024 * 1024;

interface HttpSession {
  transport: StreamableHTTPServerTransport;
  server: McpServer;
  sandboxes: SandboxSession;
  lastActive: number;
  /** POSTs being answered: a session is not idle while a tool runs. */
  active: number;
}

/** Whether the Authorization header carries `token`, compared in constant time. */
export function authorized(header: string | undefined, token: string): boolean {
  const m = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '');
  // Digests have one length whatever was sent, so the comparison time says nothing.
  const got = createHash('sha256').update(m ? m[1]! : '').digest();
  const want = createHash('sha256').update(token).digest();
  return timingSafeEqual(got, want) && m !== null;
}

function jsonError(res: http.ServerResponse, status: number, message: string, headers: Record<string, string> = {}): void {
  if (res.headersSent) return;
  res.writeHead(status, {'content-type': 'application/json', ...headers});
  res.end(JSON.stringify({jsonrpc: '2.0', error: {code: -32000, message}, id: null}));
}

function readBody(req: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let size = 0;
    req.on('data', (d: Buffer) => {
      size += d.length;
      if (size > kMaxBodyBytes) {
        reject(new Error(`request body over ${kMaxBodyBytes} bytes`));
        req.destroy();
        return;
      }
      parts.push(d);
    });
    req.on('end', () => resolve(Buffer.concat(parts)));
    req.on('error', reject);
  });
}

export class HttpServer {
  private readonly sessions = new Map<string, HttpSession>();
  private readonly http: http.Server;
  private sweeper: NodeJS.Timeout | undefined;

  constructor(private readonly options: Options, private readonly client: Client,
              private readonly log: (line: string) => void) {
    this.http = http.createServer((req, res) => {
      this.handle(req, res).catch((e) => {
        this.log(`HTTP ${req.method} ${req.url}: ${(e as Error).message}`);
        jsonError(res, 500, 'internal error');
      });
    });
  }

  /** Listens on options.listen; resolves with the bound port. */
  async start(): Promise<number> {
    const i = this.options.listen.lastIndexOf(':');
    const host = this.options.listen.slice(0, i).replace(/^\[(.*)\]$/, '$1');
    const port = Number(this.options.listen.slice(i + 1));
    await new Promise<void>((resolve, reject) => {
      this.http.once('error', reject);
      this.http.listen(port, host, () => resolve());
    });
    const bound = (this.http.address() as AddressInfo).port;
    if (this.options.portFile) fs.writeFileSync(this.options.portFile, `${bound}\n`);
    const every = Math.max(250, Math.min(this.options.idleTimeoutMs / 4, 30000));
    this.sweeper = setInterval(() => this.expireIdle(), every);
    this.sweeper.unref();
    return bound;
  }

  /** Stops listening and ends every session (releasing their sandboxes). */
  async stop(): Promise<void> {
    clearInterval(this.sweeper);
    this.http.close();
    await Promise.all([...this.sessions.keys()].map((id) => this.endSession(id, 'shutdown')));
    this.http.closeAllConnections();
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://localhost');
    if (!authorized(req.headers.authorization, this.options.token)) {
      req.resume();
      jsonError(res, 401, 'missing or wrong bearer token', {'www-authenticate': 'Bearer realm="sbx-mcp"'});
      return;
    }
    if (url.pathname !== '/mcp') {
      req.resume();
      jsonError(res, 404, `no endpoint ${url.pathname}; MCP is served on /mcp`);
      return;
    }
    let body: unknown;
    if (req.method === 'POST') {
      try {
        const raw = await readBody(req);
        body = JSON.parse(raw.toString('utf8'));
      } catch (e) {
        jsonError(res, 400, `cannot read the request body: ${(e as Error).message}`);
        return;
      }
    }
    const sessionId = req.headers['mcp-session-id'];
    if (typeof sessionId === 'string') {
      const s = this.sessions.get(sessionId);
      if (!s) {
        req.resume();
        jsonError(res, 404, `no MCP session "${sessionId}" (it ended or expired); start a new one`);
        return;
      }
      s.lastActive = Date.now();
      const counts = req.method === 'POST';
      if (counts) s.active++;
      try {
        await s.transport.handleRequest(req, res, body);
      } finally {
        if (counts) s.active--;
        s.lastActive = Date.now();
      }
      return;
    }
    if (req.method !== 'POST' || !isInitializeRequest(body)) {
      req.resume();
      jsonError(res, 400, 'no mcp-session-id header: the first request must be an initialize POST');
      return;
    }
    if (this.sessions.size >= this.options.maxSessions) {
      jsonError(res, 503, `sbx-mcp serves ${this.options.maxSessions} sessions at most; end one first`);
      return;
    }
    await this.newSession(req, res, body);
  }

  private async newSession(req: http.IncomingMessage, res: http.ServerResponse, body: unknown): Promise<void> {
    const id = randomUUID();
    const sandboxes = new SandboxSession(id, this.client, this.options.maxSandboxesPerSession, this.log);
    const server = createMcpServer(sandboxes, this.options);
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => id,
      onsessioninitialized: (sid) => {
        this.sessions.set(sid, {transport, server, sandboxes, lastActive: Date.now(), active: 0});
      },
      onsessionclosed: (sid) => { void this.endSession(sid, 'DELETE'); },
    });
    transport.onclose = () => { void this.endSession(id, 'transport closed'); };
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
    if (!this.sessions.has(id)) {
      // The initialize failed: nothing can refer to this session.
      await server.close();
      await sandboxes.close('initialize failed');
    }
  }

  /** Ends a session: forgets it, closes its transport and releases its sandboxes. */
  private async endSession(id: string, reason: string): Promise<void> {
    const s = this.sessions.get(id);
    if (!s) return;
    this.sessions.delete(id);
    await Promise.allSettled([s.sandboxes.close(reason), s.server.close()]);
  }

  private expireIdle(): void {
    const now = Date.now();
    for (const [id, s] of this.sessions) {
      if (s.active === 0 && now - s.lastActive > this.options.idleTimeoutMs) {
        void this.endSession(id, `idle for more than ${this.options.idleTimeoutMs} ms`);
      }
    }
  }
}
