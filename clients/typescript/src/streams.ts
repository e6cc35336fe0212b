// Streamed files (UploadFile, DownloadFile, UploadTar, DownloadTar) and WatchDir: any
// size in constant memory. Uploads wait for the transport to drain before reading more
// of their source; downloads yield chunks as they come (the consumer's pace pauses the
// stream). Directories travel as tar streams (node-tar), never spooled whole.
import * as grpc from '@grpc/grpc-js';
import fs from 'node:fs';
import path from 'node:path';
import {pipeline} from 'node:stream/promises';
import {Readable} from 'node:stream';
import * as tar from 'tar';

import {DeadlineExceeded, SbxError, toSbxError, abortedError} from './errors.js';
import {iterateStream, type CallOptions} from './transport.js';
import type {Raw} from './types.js';
import type {Context} from './sandbox.js';

/** What {@link SandboxFiles.upload} takes: bytes, text, or chunks (a Node Readable is one). */
export type UploadSource = string | Uint8Array | AsyncIterable<Uint8Array | string>;

/** Options of the streamed transfers. Their deadline defaults to an hour, not the client's timeout. */
export interface TransferOptions extends CallOptions {
  /** Permission bits of the file (upload). Default 0o644 for a new file (uploadFile: the local file's). */
  mode?: number;
  /** Create missing parent directories (upload). Default true. */
  createParents?: boolean;
}

/** A change {@link SandboxFiles.watch} reports. */
export interface FileEvent {
  type: 'create' | 'write' | 'remove' | 'rename' | 'chmod' | 'overflow';
  /** The watched path joined with the names below it ("" for overflow). */
  path: string;
  isDir: boolean;
}

const kChunk = 1024 * 1024;
const kInFlight = 4;
const kTransferMs = 3600_000;

function transferDeadline(opts: CallOptions | undefined): Date {
  return new Date(Date.now() + (opts?.timeoutMs ?? kTransferMs));
}

/** Splits a source into chunks of at most 1 MiB. */
async function* chunksOf(source: UploadSource): AsyncGenerator<Buffer> {
  if (typeof source === 'string' || source instanceof Uint8Array) {
    const b = typeof source === 'string' ? Buffer.from(source) : Buffer.from(source.buffer, source.byteOffset, source.byteLength);
    for (let off = 0; off < b.length; off += kChunk) yield b.subarray(off, off + kChunk);
    return;
  }
  for await (const part of source) {
    const b = typeof part === 'string' ? Buffer.from(part) : Buffer.from(part.buffer, part.byteOffset, part.byteLength);
    for (let off = 0; off < b.length; off += kChunk) yield b.subarray(off, off + kChunk);
  }
}

/**
 * A client-streamed upload: `start`, the chunks (waiting for the transport to drain),
 * `finish`, then the server's answer. A failure of the source cancels the call, so the
 * sandbox keeps nothing.
 */
export async function streamUpload(ctx: Context, method: 'UploadFile' | 'UploadTar', start: Raw,
                                   source: UploadSource, opts: CallOptions = {}): Promise<Raw> {
  if (opts.signal?.aborted) throw abortedError(opts.signal.reason);
  const stub = ctx.transport.stubs.sandboxes;
  let call!: grpc.ClientWritableStream<Raw>;
  const answer = new Promise<Raw>((resolve, reject) => {
    call = (stub[method] as (md: grpc.Metadata, o: grpc.CallOptions, cb: grpc.requestCallback<Raw>) => grpc.ClientWritableStream<Raw>)
        .call(stub, ctx.transport.metadata(), {deadline: transferDeadline(opts)}, (err, res) => {
          if (err) reject(toSbxError(err, {abortReason: opts.signal?.aborted ? opts.signal.reason : undefined}));
          else resolve(res);
        });
  });
  answer.catch(() => {});
  const onAbort = () => call.cancel();
  opts.signal?.addEventListener('abort', onAbort, {once: true});
  let failed = false;
  const closed = new Promise<void>((resolve) => call.on('status', () => { failed = true; resolve(); }));
  try {
    // At most kInFlight messages between us and the socket: each write's callback says
    // the transport took it, and the stream's own buffer (16 messages) is never filled.
    const inFlight: Promise<void>[] = [];
    const write = async (msg: Raw) => {
      if (failed) return;
      inFlight.push(new Promise<void>((resolve) => call.write(msg, () => resolve())));
      if (inFlight.length >= kInFlight) await Promise.race([inFlight.shift()!, closed]);
    };
    await write({start});
    for await (const chunk of chunksOf(source)) {
      if (failed) break;
      await write({chunk});
    }
    await write({finish: true});
    call.end();
  } catch (e) {
    call.cancel();
    await answer.catch(() => {});
    throw e;  // the source's own error (the call is cancelled: the sandbox keeps nothing)
  } finally {
    opts.signal?.removeEventListener('abort', onAbort);
  }
  return answer;
}

/** A server-streamed download's chunks. */
export async function* streamDownload(ctx: Context, method: 'DownloadFile' | 'DownloadTar', claimId: string, p: string,
                                      opts: CallOptions = {}): AsyncGenerator<Buffer> {
  const stub = ctx.transport.stubs.sandboxes;
  const call = (stub[method] as (r: Raw, md: grpc.Metadata, o: grpc.CallOptions) => grpc.ClientReadableStream<Raw>)
      .call(stub, {claim_id: claimId, path: p}, ctx.transport.metadata(), {deadline: transferDeadline(opts)});
  for await (const msg of iterateStream(call, opts.signal)) {
    if (msg.data && msg.data.length) yield Buffer.isBuffer(msg.data) ? msg.data : Buffer.from(msg.data);
  }
}

/** Writes `chunks` to a temporary file beside `dest`, renamed over it at the end. */
export async function toLocalFile(chunks: AsyncIterable<Buffer>, dest: string): Promise<number> {
  const dir = path.dirname(path.resolve(dest));
  const temp = path.join(dir, `.${path.basename(dest)}.sbx-${process.pid}-${Date.now()}`);
  let n = 0;
  const counted = async function* () {
    for await (const c of chunks) {
      n += c.length;
      yield c;
    }
  };
  try {
    await pipeline(Readable.from(counted()), fs.createWriteStream(temp, {flags: 'wx', mode: 0o600}));
    await fs.promises.rename(temp, dest);
  } catch (e) {
    await fs.promises.rm(temp, {force: true});
    throw e;
  }
  return n;
}

/** The local directory `dir` as a tar stream (its entries, not the directory itself). */
export function tarOf(dir: string): AsyncIterable<Uint8Array> {
  const entries = fs.readdirSync(dir).sort();
  return tar.create({cwd: dir, portable: true}, entries) as unknown as AsyncIterable<Uint8Array>;
}

/**
 * Extracts a tar stream from the sandbox into `dir`, treating it as hostile: only
 * directories and regular files (never a link, device or FIFO), no absolute names or
 * `..` (node-tar strips or refuses them), modes without setuid/setgid/sticky.
 * Resolves with the number of entries written.
 */
export async function untarInto(chunks: AsyncIterable<Buffer>, dir: string): Promise<number> {
  await fs.promises.mkdir(dir, {recursive: true});
  let written = 0;
  const x = tar.extract({
    cwd: dir, strict: true, preservePaths: false, preserveOwner: false, noMtime: false,
    filter: (_p: string, entry: unknown) => {
      const type = (entry as {type?: string}).type;
      const ok = type === 'File' || type === 'OldFile' || type === 'ContiguousFile' || type === 'Directory';
      if (ok) written++;
      return ok;
    },
  });
  await pipeline(Readable.from(chunks), x as unknown as NodeJS.WritableStream);
  return written;
}

/** An open WatchDir stream; iterate it for {@link FileEvent}s, `close()` to stop. */
export class FileWatch implements AsyncIterable<FileEvent>, AsyncDisposable {
  /** @internal */
  constructor(private readonly events: AsyncGenerator<Raw>, private readonly call: grpc.ClientReadableStream<Raw>) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<FileEvent> {
    try {
      for await (const e of this.events) {
        if (e.overflow) {
          yield {type: 'overflow', path: '', isDir: false};
        } else if (!e.ready) {
          const type = String(e.type).replace('FILE_EVENT_', '').toLowerCase() as FileEvent['type'];
          yield {type, path: e.path, isDir: !!e.is_dir};
        }
      }
    } catch (e) {
      if (!(e instanceof SbxError && e.grpcCode === grpc.status.CANCELLED)) throw e;
    }
  }

  /** Ends the watch. */
  close(): void {
    this.call.cancel();  // not events.return(): that would wait for the next event
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

/** Opens WatchDir and resolves once the watch is set up (its `ready` message). */
export async function openWatch(ctx: Context, claimId: string, p: string, recursive: boolean,
                                opts: CallOptions = {}): Promise<FileWatch> {
  const stub = ctx.transport.stubs.sandboxes;
  const call = (stub.WatchDir as (r: Raw, md: grpc.Metadata, o: grpc.CallOptions) => grpc.ClientReadableStream<Raw>)
      .call(stub, {claim_id: claimId, path: p, recursive}, ctx.transport.metadata(), {});
  const events = iterateStream(call, opts.signal);
  const limit = opts.timeoutMs ?? ctx.timeoutMs;
  let timedOut = false;
  const timer = setTimeout(() => { timedOut = true; call.cancel(); }, limit);
  try {
    const first = await events.next();
    if (first.done) throw new SbxError(grpc.status.INTERNAL, 'WatchDir ended before it was ready');
  } catch (e) {
    if (timedOut) throw new DeadlineExceeded(grpc.status.DEADLINE_EXCEEDED, `WatchDir was not ready within ${limit} ms`);
    throw e;
  } finally {
    clearTimeout(timer);
  }
  return new FileWatch(events, call);
}
