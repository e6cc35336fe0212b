#!/usr/bin/env node
// sbx-mcp: parse flags, make the sbx client, serve stdio or HTTP, and on the way out
// release every session's sandboxes.
import {randomUUID} from 'node:crypto';

import {StdioServerTransport} from '@modelcontextprotocol/sdk/server/stdio.js';
import {Client} from '@sbx/client';

import {HttpServer} from './http.js';
import {parseOptions, type Options} from './options.js';
import {SandboxSession} from './session.js';
import {createMcpServer} from './tools.js';

// stdout belongs to the MCP protocol in stdio mode: everything else goes to stderr.
const log = (line: string): void => { process.stderr.write(`sbx-mcp: ${line}\n`); };

/** Runs `stop` once, on the first of SIGINT, SIGTERM or `also`, then exits. */
function onShutdown(stop: (reason: string) => Promise<void>): (reason: string) => void {
  let stopping = false;
  const shutdown = (reason: string): void => {
    if (stopping) return;
    stopping = true;
    // A bound on the releases, so that a hung sbx server does not keep the process.
    const timer = setTimeout(() => { log('releases did not finish within 20 s; exiting'); process.exit(1); }, 20000);
    stop(reason).then(() => { clearTimeout(timer); process.exit(0); },
                      (e) => { log(`shutdown: ${(e as Error).message}`); process.exit(1); });
  };
  process.on('SIGINT', () => shutdown('SIGINT'));
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  return shutdown;
}

async function serveStdio(options: Options, client: Client): Promise<void> {
  const session = new SandboxSession(randomUUID(), client, options.maxSandboxesPerSession, log);
  const server = createMcpServer(session, options);
  const transport = new StdioServerTransport();
  const shutdown = onShutdown(async (reason) => {
    await session.close(reason);
    await server.close();
    client.close();
  });
  // The client closing our stdin ends the session.
  process.stdin.on('end', () => shutdown('stdin closed'));
  process.stdin.on('close', () => shutdown('stdin closed'));
  transport.onclose = () => shutdown('transport closed');
  await server.connect(transport);
}

async function serveHttp(options: Options, client: Client): Promise<void> {
  const server = new HttpServer(options, client, log);
  const port = await server.start();
  const host = options.listen.slice(0, options.listen.lastIndexOf(':'));
  log(`serving MCP (Streamable HTTP) on http://${host}:${port}/mcp`);
  onShutdown(async () => {
    await server.stop();
    client.close();
  });
}

async function main(): Promise<void> {
  let options: Options;
  try {
    options = parseOptions(process.argv.slice(2), process.env);
  } catch (e) {
    const text = (e as Error).message;
    process.stderr.write(text.startsWith('usage:') ? text : `sbx-mcp: ${text}\n`);
    process.exit(text.startsWith('usage:') ? 0 : 2);
  }
  let client: Client;
  try {
    client = new Client(options.client);
  } catch (e) {
    log((e as Error).message);
    process.exit(2);
  }
  if (options.mode === 'http') await serveHttp(options, client);
  else await serveStdio(options, client);
}

main().catch((e) => {
  log((e as Error).stack ?? String(e));
  process.exit(1);
});
