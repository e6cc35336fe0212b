// examples/e2b_hello.mjs, the ten-line E2B program of docs/e2b.md, run as a user runs it:
// a separate node process, unchanged, pointed at sbx only by its environment
// (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). Its output is checked line by line.
import assert from 'node:assert/strict';
import {execFile} from 'node:child_process';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {promisify} from 'node:util';
import {after, before, test} from 'node:test';

import {ALICE, TestServer} from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const server = new TestServer();

before(async () => {
  await server.start();
});

after(async () => {
  await server.cleanUp();
});

test('the ten-line E2B program runs unchanged against sbx', async () => {
  const env = {PATH: process.env.PATH, E2B_API_URL: server.url, E2B_SANDBOX_URL: server.url,
               E2B_API_KEY: ALICE};
  const {stdout} = await promisify(execFile)(
      process.execPath, [path.join(here, 'examples', 'e2b_hello.mjs')], {env, timeout: 60_000});
  const lines = stdout.trimEnd().split('\n');
  // "<GREETING> from <uname -s>", the sandbox user's uid (as read back from the file it
  // wrote), an empty line (the file's last newline), then the list of its sandbox ids.
  assert.equal(lines[0], 'hi from Linux');
  assert.match(lines[1], /^\d+$/);
  assert.equal(lines[2], '');
  assert.match(lines[3], /^\[ '[a-z0-9]+' \]$/, stdout);
  assert.equal(lines.length, 4, stdout);
});
