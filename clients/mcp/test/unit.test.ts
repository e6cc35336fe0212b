// Without servers: the output bounds (limits.ts) on edge cases, the options (flags,
// environment, refusals) and the bearer token check.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {describe, it} from 'node:test';

import {authorized} from '../src/http.js';
import {
  base64Bytes, boundLines, boundOutput, countChars, cutMarker, cutMiddle, HeadTail, utf8PrefixBytes,
} from '../src/limits.js';
import {parseOptions} from '../src/options.js';

describe('limits', () => {
  it('counts and cuts code points, never splitting a surrogate pair', () => {
    const s = '😀'.repeat(10);  // 20 UTF-16 units, 10 characters
    assert.equal(countChars(s), 10);
    assert.equal(cutMiddle(s, 10), s);
    assert.equal(cutMiddle(s, 5), '😀😀' + cutMarker(5) + '😀😀😀');
    assert.equal(countChars('a\ud800b'), 3);  // a lone surrogate is one
  });

  it('splits the budget between stdout and stderr', () => {
    assert.deepEqual(boundOutput('abc', 'de', 5), {stdout: 'abc', stderr: 'de', truncated: false, stdoutChars: 3, stderrChars: 2});
    const b = boundOutput('x'.repeat(8), 'y'.repeat(8), 10);
    assert.equal(b.stdout, 'xx' + cutMarker(3) + 'xxx');
    assert.equal(b.stderr, 'yy' + cutMarker(3) + 'yyy');
    const small = boundOutput('x'.repeat(20), 'yy', 10);  // stderr whole, stdout the other 8
    assert.equal(small.stderr, 'yy');
    assert.equal(small.stdout, 'xxxx' + cutMarker(12) + 'xxxx');
  });

  it('bounds file reads and listings', () => {
    const buf = Buffer.from('aé😀b');  // 1 + 2 + 4 + 1 bytes
    assert.equal(utf8PrefixBytes(buf, 0), 0);
    assert.equal(utf8PrefixBytes(buf, 2), 3);
    assert.equal(utf8PrefixBytes(buf, 3), 7);
    assert.equal(utf8PrefixBytes(buf, 9), 8);
    assert.equal(base64Bytes(30000), 22500);
    assert.equal(base64Bytes(7), 3);
    assert.deepEqual(boundLines(['ab', 'cd', 'ef'], 6), {text: 'ab\ncd\n', shown: 2});
    assert.deepEqual(boundLines(['ab', 'cd', 'ef'], 8), {text: 'ab\ncd\n', shown: 2});
    assert.deepEqual(boundLines(['ab'], 2), {text: '', shown: 0});
  });
});

describe('options', () => {
  it('takes flags and environment', () => {
    const o = parseOptions(['--max-output-chars', '500', '--idle-timeout=1m30s', '--server', 'h:1', '--default-ttl', '2h'],
                           {SBX_CA: '/ca.pem', SBX_MCP_MAX_OUTPUT_CHARS: '200'});
    assert.equal(o.mode, 'stdio');
    assert.equal(o.maxOutputChars, 500);  // the flag wins over the environment
    assert.equal(o.idleTimeoutMs, 90000);
    assert.deepEqual(o.client, {ca: '/ca.pem', server: 'h:1'});
    assert.equal(o.defaultTtl, '2h');
    assert.equal(parseOptions([], {SBX_MCP_MAX_OUTPUT_CHARS: '200', SBX_MCP_IDLE_TIMEOUT: '5s'}).maxOutputChars, 200);
    assert.equal(parseOptions([], {}).maxOutputChars, 30000);
  });

  it('refuses HTTP without a token, and bad values, naming them', () => {
    assert.throws(() => parseOptions(['--http'], {}), /--http needs a bearer token/);
    assert.throws(() => parseOptions(['--http'], {SBX_MCP_TOKEN: 'short'}), /shorter than 16/);
    assert.throws(() => parseOptions(['--max-output-chars', 'lots'], {}), /--max-output-chars "lots"/);
    assert.throws(() => parseOptions(['--idle-timeout', '5 min'], {}), /--idle-timeout "5 min" is not a duration/);
    assert.throws(() => parseOptions(['--nope'], {}), /unknown argument "--nope"/);
    assert.throws(() => parseOptions(['--http', '--token-file', '/no/such/file'], {}), /--token-file "\/no\/such\/file" cannot be read/);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-mcp-unit-'));
    try {
      fs.writeFileSync(path.join(dir, 't'), 'from-the-file-0123456789\nignored\n');
      const o = parseOptions(['--http', '--token-file', path.join(dir, 't')], {SBX_MCP_TOKEN: 'from-the-env-0123456789'});
      assert.equal(o.token, 'from-the-file-0123456789');
    } finally {
      fs.rmSync(dir, {recursive: true, force: true});
    }
  });

  it('checks the bearer token', () => {
    const t = 'secret-0123456789abcdef';
    assert.equal(authorized(`Bearer ${t}`, t), true);
    assert.equal(authorized(`bearer ${t}`, t), true);
    assert.equal(authorized(undefined, t), false);
    assert.equal(authorized('', t), false);
    assert.equal(authorized(t, t), false);
    assert.equal(authorized(`Bearer ${t}x`, t), false);
    assert.equal(authorized(`Basic ${t}`, t), false);
  });
});

describe('HeadTail (read_process_output)', () => {
  it('keeps everything up to twice its size, then the head and the tail with the count between', () => {
    const small = new HeadTail(4);
    small.add(Buffer.from('abc'));
    small.add(Buffer.from('defgh'));
    assert.equal(small.text(), 'abcdefgh');
    assert.equal(small.cut, false);
    assert.equal(small.total, 8);

    const big = new HeadTail(4);
    for (const part of ['ab', 'cdef', 'ghij', 'klmnop', 'q']) big.add(Buffer.from(part));
    assert.equal(big.total, 17);
    assert.equal(big.cut, true);
    assert.equal(big.text(), 'abcd\n[... sbx-mcp: 9 bytes not kept ...]\nnopq');
  });
});
