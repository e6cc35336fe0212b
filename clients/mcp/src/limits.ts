// The output bounds of tool results (docs/mcp.md "Limits"), so that an agent's context
// survives a command that prints megabytes. Characters are Unicode code points.

/** Code points in `s` (a surrogate pair is one). */
export function countChars(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++, n++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) i++;
    }
  }
  return n;
}

/** Index (UTF-16) just after the first `k` code points of `s`. */
function indexAfter(s: string, k: number): number {
  let i = 0;
  for (let n = 0; n < k && i < s.length; n++) {
    const c = s.charCodeAt(i);
    i += c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00 ? 2 : 1;
  }
  return i;
}

/** Index (UTF-16) where the last `k` code points of `s` start. */
function indexBeforeLast(s: string, k: number): number {
  let i = s.length;
  for (let n = 0; n < k && i > 0; n++) {
    const c = s.charCodeAt(i - 1);
    i -= (c & 0xfc00) === 0xdc00 && i >= 2 && (s.charCodeAt(i - 2) & 0xfc00) === 0xd800 ? 2 : 1;
  }
  return i;
}

/** The line put where a stream was cut; not counted in the limit. */
export function cutMarker(cutChars: number): string {
  return `\n[... sbx-mcp: ${cutChars} characters cut ...]\n`;
}

/**
 * `s` cut to `keep` code points: its first floor(keep/2) and its last keep - floor(keep/2)
 * code points with {@link cutMarker} between them. Unchanged when it has at most `keep`.
 */
export function cutMiddle(s: string, keep: number, total = countChars(s)): string {
  if (total <= keep) return s;
  const head = Math.floor(keep / 2);
  return s.slice(0, indexAfter(s, head)) + cutMarker(total - keep) + s.slice(indexBeforeLast(s, keep - head));
}

/** A command's stdout and stderr within `limit` characters together. */
export interface BoundedOutput {
  stdout: string;
  stderr: string;
  /** True when characters were cut (here or, beyond its own limit, by the server). */
  truncated: boolean;
  /** Characters of each stream before the cut. */
  stdoutChars: number;
  stderrChars: number;
}

/**
 * Bounds a command's output: when stdout and stderr have more than `limit` characters
 * together, stderr keeps min(its length, max(limit - stdout length, floor(limit/2)))
 * and stdout the rest of the limit; each cut stream keeps its head and tail
 * ({@link cutMiddle}).
 */
export function boundOutput(stdout: string, stderr: string, limit: number): BoundedOutput {
  const outChars = countChars(stdout);
  const errChars = countChars(stderr);
  if (outChars + errChars <= limit) {
    return {stdout, stderr, truncated: false, stdoutChars: outChars, stderrChars: errChars};
  }
  const errKeep = Math.min(errChars, Math.max(limit - outChars, Math.floor(limit / 2)));
  const outKeep = Math.min(outChars, limit - errKeep);
  return {
    stdout: cutMiddle(stdout, outKeep, outChars), stderr: cutMiddle(stderr, errKeep, errChars), truncated: true,
    stdoutChars: outChars, stderrChars: errChars,
  };
}

/**
 * Byte length of the first `chars` UTF-8 characters of `buf` (a character starts at every
 * byte that is not a continuation byte 10xxxxxx), or all of it.
 */
export function utf8PrefixBytes(buf: Uint8Array, chars: number): number {
  let starts = 0;
  for (let i = 0; i < buf.length; i++) {
    if ((buf[i]! & 0xc0) !== 0x80) {
      if (starts === chars) return i;
      starts++;
    }
  }
  return buf.length;
}

/** Bytes a base64 result of at most `limit` characters can carry. */
export function base64Bytes(limit: number): number {
  return Math.floor(limit / 4) * 3;
}

/** As many whole lines as fit in `limit` characters, each counted with its newline. */
export function boundLines(lines: string[], limit: number): {text: string; shown: number} {
  let used = 0;
  let shown = 0;
  for (const line of lines) {
    const n = countChars(line) + 1;
    if (used + n > limit) break;
    used += n;
    shown++;
  }
  return {text: lines.slice(0, shown).map((l) => l + '\n').join(''), shown};
}

/**
 * One stream of a process's output read for read_process_output, in bounded memory: its
 * first `keepBytes` bytes and its last `keepBytes` bytes, with the count of all of them.
 */
export class HeadTail {
  private head: Buffer[] = [];
  private headBytes = 0;
  private tail: Buffer[] = [];
  private tailBytes = 0;
  /** Every byte seen, the kept ones included. */
  total = 0;

  constructor(private readonly keepBytes: number) {}

  add(data: Buffer): void {
    this.total += data.length;
    if (this.headBytes < this.keepBytes) {
      const take = Math.min(data.length, this.keepBytes - this.headBytes);
      this.head.push(data.subarray(0, take));
      this.headBytes += take;
      data = data.subarray(take);
    }
    if (data.length === 0) return;
    this.tail.push(data);
    this.tailBytes += data.length;
    while (this.tailBytes - this.tail[0]!.length >= this.keepBytes) this.tailBytes -= this.tail.shift()!.length;
  }

  /** True when bytes between the head and the tail were dropped. */
  get cut(): boolean {
    return this.total > this.headBytes + Math.min(this.tailBytes, this.keepBytes);
  }

  /** The kept text (UTF-8; a marker where bytes were dropped). */
  text(): string {
    const head = Buffer.concat(this.head).toString('utf8');
    let tail = Buffer.concat(this.tail);
    if (tail.length > this.keepBytes) tail = tail.subarray(tail.length - this.keepBytes);
    const dropped = this.total - this.headBytes - tail.length;
    return dropped > 0 ? `${head}\n[... sbx-mcp: ${dropped} bytes not kept ...]\n${tail.toString('utf8')}` :
                         head + tail.toString('utf8');
  }
}
