// Drives sbx-mcp the way an agent's MCP client does: starts `sbx-mcp --stdio` (this
// package's dist/cli.js), lists its tools, claims a sandbox, writes a file, runs it,
// and closes, which releases the sandbox. Needs an sbx server at $SBX_SERVER
// (default 127.0.0.1:50051, e.g. scripts/run) with the pool "default".
import path from 'node:path';
import {fileURLToPath} from 'node:url';

import {Client} from '@modelcontextprotocol/sdk/client/index.js';
import {StdioClientTransport} from '@modelcontextprotocol/sdk/client/stdio.js';

const cli = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../dist/cli.js');
const client = new Client({name: 'quickstart', version: '1'});
await client.connect(new StdioClientTransport({command: process.execPath, args: [cli, '--stdio'],
                                               env: {...process.env}}));
const call = async (name, args) => {
  const r = await client.callTool({name, arguments: args});
  if (r.isError) throw new Error(r.content[0].text);
  return JSON.parse(r.content[0].text);
};
try {
  console.log('tools:', (await client.listTools()).tools.map((t) => t.name).join(' '));
  const {sandbox} = await call('claim_sandbox', {pool: 'default', ttl: '10m'});
  await call('write_file', {sandbox, path: 'hello.sh', content: 'echo "hello from $(uname -s)"\n'});
  const r = await call('run_command', {sandbox, command: 'sh hello.sh'});
  console.log(r.stdout.trim(), `(exit ${r.exit_code})`);
} finally {
  await client.close();  // ends the session: sbx-mcp releases its sandboxes
}
