// Handles on claimed sandboxes: Sandbox (one claim), SandboxFiles (its workspace) and
// SandboxGroup (the claims of one ClaimBatch).
import './polyfill.js';

import * as grpc from '@grpc/grpc-js';
import fs from 'node:fs';

import {FailedPrecondition, InvalidArgument, NotFound} from './errors.js';
import {ExecProcess, type ExecChunk, type ExecResult} from './exec.js';
import {
  DEFAULT_PTY_CMD, SandboxProcesses, SandboxPty, type OpenPtyOptions,
} from './process.js';
import {
  openWatch, streamDownload, streamUpload, tarOf, toLocalFile, untarInto, type FileWatch, type TransferOptions,
  type UploadSource,
} from './streams.js';
import {type CallOptions, type Transport} from './transport.js';
import {
  durationMs, fromTimestamp, toClaim, toFileInfo, toProtoDuration, toSandboxInfo, toSnapshot, type Claim,
  type Duration, type FileInfo, type Raw, type SandboxInfo, type Snapshot,
} from './types.js';

/** Options of {@link Sandbox.snapshot}. */
export interface SnapshotOptions extends CallOptions {
  /** At most 128 bytes; not unique. */
  name?: string;
  /** At most 64, as claim labels. */
  labels?: Record<string, string>;
}

/** @internal The id of a Snapshot or a snapshot id; InvalidArgument before any call otherwise. */
export function snapshotIdOf(s: Snapshot | string, what: string): string {
  const id = typeof s === 'string' ? s : s?.id;
  if (typeof id !== 'string' || id === '') {
    throw new InvalidArgument(grpc.status.INVALID_ARGUMENT, `${what}: a Snapshot or a snapshot id, not ${JSON.stringify(s)}`);
  }
  return id;
}

/** What {@link Sandbox.url} resolves with. */
export interface PortUrl {
  /** The path form: <proxy>/_sbx/<claim>/<port>/?sbx_token=<token>. */
  url: string;
  /** The host-name form, when the server has --proxy_domain; else ''. */
  hostUrl: string;
  /** The signed token alone (query parameter sbx_token or header X-Sbx-Token). */
  token: string;
  expiresAt: Date | null;
}

/** @internal What handles need from their Client. */
export interface Context {
  transport: Transport;
  /** Default deadline of a call, ms. */
  timeoutMs: number;
}

/** @internal Absolute deadline of a call. */
export function deadlineOf(ctx: Context, opts: CallOptions | undefined, extraMs = 0): number {
  return Date.now() + (opts?.timeoutMs ?? ctx.timeoutMs) + extraMs;
}

/** Options of {@link Sandbox.exec} and {@link Sandbox.execStream}. */
export interface ExecOptions extends CallOptions {
  /** Extra environment variables (they win over the claim's and the template's). */
  env?: Record<string, string>;
  /** Working directory relative to the workspace. Default: the workspace. */
  cwd?: string;
  /** The command's wall-clock limit; it is killed (SIGKILL) when it passes. Default 10 minutes. */
  timeout?: Duration;
  /** Cap on stdout + stderr bytes sent back (beyond it output is dropped, `truncated`). Default 16 MiB. */
  maxOutputBytes?: number;
}

/** Options of {@link Sandbox.exec}. */
export interface ExecCollectOptions extends ExecOptions {
  /** Data for the command's stdin (then closed). Without it stdin is /dev/null. */
  stdin?: string | Uint8Array;
}

/** Options of {@link Sandbox.execStream}. */
export interface ExecStreamOptions extends ExecOptions {
  /**
   * `true`: stdin is a pipe fed by {@link ExecProcess.write} until
   * {@link ExecProcess.closeStdin}. Data: written, then closed. Default: /dev/null.
   */
  stdin?: boolean | string | Uint8Array;
}

/** Options of {@link SandboxFiles.write}. */
export interface WriteFileOptions extends CallOptions {
  /** Permission bits of a new file (e.g. 0o755). Default 0o644; an existing file keeps its mode. */
  mode?: number;
  /** Append instead of replacing. Default false. */
  append?: boolean;
  /** Create missing parent directories. Default true. */
  createParents?: boolean;
}

const kFileChunk = 1024 * 1024;
const kDefaultExecTimeoutMs = 10 * 60 * 1000;

function bytesOf(data: string | Uint8Array): Buffer {
  return typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
}

/**
 * The workspace of a claimed sandbox. Paths are relative to the workspace; they may not
 * be absolute or contain `.` or `..` components.
 */
export class SandboxFiles {
  /** @internal */
  constructor(private readonly sandbox: Sandbox, private readonly ctx: Context) {}

  /**
   * Writes a file, replacing it (atomically, up to 1 MiB) or appending. Larger contents
   * go in 1 MiB calls: the first replaces, the next append (only the first is retried).
   * Resolves with the file's size after the write.
   */
  async write(path: string, content: string | Uint8Array, opts: WriteFileOptions = {}): Promise<number> {
    const buf = bytesOf(content);
    const deadline = deadlineOf(this.ctx, opts);
    let size = 0;
    for (let off = 0; off === 0 || off < buf.length; off += kFileChunk) {
      const append = off > 0 || !!opts.append;
      const res = await this.ctx.transport.unary({
        stub: 'sandboxes', method: 'WriteFile', deadline, signal: opts.signal, idempotent: !append,
        request: {
          claim_id: this.sandbox.claimId, path, content: buf.subarray(off, off + kFileChunk),
          mode: opts.mode ?? 0, append, create_parents: opts.createParents ?? true,
        },
      });
      size = Number(res.size);
      if (buf.length === 0) break;
    }
    return size;
  }

  /** Reads a whole file (in 1 MiB ranges). Throws NotFound when it does not exist. */
  async read(path: string, opts: CallOptions = {}): Promise<Buffer> {
    const deadline = deadlineOf(this.ctx, opts);
    const parts: Buffer[] = [];
    for (let offset = 0; ;) {
      const res = await this.ctx.transport.unary({
        stub: 'sandboxes', method: 'ReadFile', deadline, signal: opts.signal, idempotent: true,
        request: {claim_id: this.sandbox.claimId, path, offset: String(offset), limit: String(kFileChunk)},
      });
      const chunk = Buffer.from(res.content);
      parts.push(chunk);
      offset += chunk.length;
      if (res.eof || chunk.length === 0) break;
    }
    return Buffer.concat(parts);
  }

  /** Reads a whole file as UTF-8 text. */
  async readText(path: string, opts: CallOptions = {}): Promise<string> {
    return (await this.read(path, opts)).toString('utf8');
  }

  /** Lists a directory ("" is the workspace), every page; `recursive` lists everything below it. */
  async list(path = '', opts: CallOptions & {recursive?: boolean} = {}): Promise<FileInfo[]> {
    const deadline = deadlineOf(this.ctx, opts);
    const out: FileInfo[] = [];
    let token = '';
    do {
      const res = await this.ctx.transport.unary({
        stub: 'sandboxes', method: 'ListFiles', deadline, signal: opts.signal, idempotent: true,
        request: {claim_id: this.sandbox.claimId, path, recursive: !!opts.recursive, page_size: 1000, page_token: token},
      });
      for (const f of res.files) out.push(toFileInfo(f));
      token = res.next_page_token;
    } while (token);
    return out;
  }

  /**
   * Whether a file or directory exists at `path`. Rejects (NotFound) when the claim
   * itself does not exist.
   */
  async exists(path: string, opts: CallOptions = {}): Promise<boolean> {
    try {
      await this.ctx.transport.unary({
        stub: 'sandboxes', method: 'ReadFile', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
        idempotent: true, request: {claim_id: this.sandbox.claimId, path, offset: '0', limit: '1'},
      });
      return true;
    } catch (e) {
      // The server says "path ...: no such file or directory" for files; a missing claim
      // is NOT_FOUND too, with another message.
      if (e instanceof NotFound && /no such file or directory/.test(e.details)) return false;
      // A directory (or another non-regular file) exists but cannot be read.
      if (e instanceof FailedPrecondition && /director|not a regular file/.test(e.details)) return true;
      throw e;
    }
  }

  /**
   * Removes a file, a symbolic link (never followed) or, with `recursive`, a directory
   * tree (the Remove call). Removing a missing path is not an error. Rejects with
   * FailedPrecondition for a non-empty directory without `recursive`, InvalidArgument for
   * the workspace itself or a path that leaves it.
   */
  async remove(path: string, opts: CallOptions & {recursive?: boolean} = {}): Promise<void> {
    try {
      await this.ctx.transport.unary({
        stub: 'sandboxes', method: 'Remove', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
        idempotent: false, request: {claim_id: this.sandbox.claimId, path, recursive: !!opts.recursive},
      });
    } catch (e) {
      // A missing path ("path ...: no such file or directory"); a missing claim is
      // NOT_FOUND too, with another message.
      if (e instanceof NotFound && /no such file or directory/.test(e.details)) return;
      throw e;
    }
  }

  // ---- streamed files: any size in constant memory. Paths may be absolute
  // ("/home/user/x": inside the sandbox's own root) or relative to the workspace.

  /**
   * Streams `source` (bytes, text, or chunks: a Node Readable, an async generator) to
   * `path`; the sandbox renames it into place only once the whole stream arrived (a failed
   * or cancelled upload leaves nothing). Resolves with the bytes written. Reads the source
   * only as fast as the connection takes it.
   */
  async upload(path: string, source: UploadSource, opts: TransferOptions = {}): Promise<number> {
    const r = await streamUpload(this.ctx, 'UploadFile', {
      claim_id: this.sandbox.claimId, path, mode: opts.mode ?? 0, create_parents: opts.createParents ?? true,
    }, source, opts);
    return Number(r.bytes);
  }

  /** Streams the local file `localPath` to `path` (its mode too, unless `mode` is given). */
  async uploadFile(localPath: string, path: string, opts: TransferOptions = {}): Promise<number> {
    const st = await fs.promises.stat(localPath);
    return this.upload(path, fs.createReadStream(localPath, {highWaterMark: 1024 * 1024}),
                       {...opts, mode: opts.mode ?? (st.mode & 0o7777)});
  }

  /**
   * The file at `path` as chunks (up to 256 KiB each), read from the sandbox as they are
   * consumed: `for await (const chunk of sb.files.download(p))`, or
   * `Readable.from(sb.files.download(p)).pipe(...)`. Breaking out cancels the transfer.
   */
  download(path: string, opts: CallOptions = {}): AsyncGenerator<Buffer> {
    return streamDownload(this.ctx, 'DownloadFile', this.sandbox.claimId, path, opts);
  }

  /** Streams the file at `path` into the local file `localPath` (written beside, renamed at the end). */
  downloadFile(path: string, localPath: string, opts: CallOptions = {}): Promise<number> {
    return toLocalFile(this.download(path, opts), localPath);
  }

  /**
   * Sends the local directory `localDir` as a tar stream and extracts it into `path`
   * ("" the workspace; created). Resolves with the number of entries.
   */
  async uploadDir(localDir: string, path = '', opts: CallOptions = {}): Promise<number> {
    const r = await streamUpload(this.ctx, 'UploadTar', {claim_id: this.sandbox.claimId, path}, tarOf(localDir), opts);
    return Number(r.entries);
  }

  /** The sandbox's directory `path` as a tar stream ("" the workspace). */
  downloadTar(path = '', opts: CallOptions = {}): AsyncGenerator<Buffer> {
    return streamDownload(this.ctx, 'DownloadTar', this.sandbox.claimId, path, opts);
  }

  /**
   * Downloads the sandbox's directory `path` into `localDir` (created). The archive is
   * treated as hostile: only directories and regular files are written, never links,
   * devices or FIFOs; absolute names and `..` are refused. Resolves with the entries written.
   */
  downloadDir(path: string, localDir: string, opts: CallOptions = {}): Promise<number> {
    return untarInto(this.downloadTar(path, opts), localDir);
  }

  /**
   * Watches the directory `path` ("" the workspace) for changes (WatchDir): resolves once
   * the watch is set up with a {@link FileWatch} to iterate; `close()` it to stop.
   */
  watch(path = '', opts: CallOptions & {recursive?: boolean} = {}): Promise<FileWatch> {
    return openWatch(this.ctx, this.sandbox.claimId, path, !!opts.recursive, opts);
  }

  /** Describes `path` (a symbolic link itself, not its target). NotFound when missing. */
  async stat(path: string, opts: CallOptions = {}): Promise<FileInfo> {
    const r = await this.ctx.transport.unary({
      stub: 'sandboxes', method: 'Stat', deadline: deadlineOf(this.ctx, opts), signal: opts.signal, idempotent: true,
      request: {claim_id: this.sandbox.claimId, path},
    });
    return toFileInfo(r.file);
  }
}

/**
 * A claimed sandbox. Release it when done: `await using sb = await client.claim(...)`,
 * or try/finally with {@link release}. Every method addresses the sandbox through its
 * claim id, so a handle made with {@link Client.sandbox} from a stored id works as well.
 */
export class Sandbox implements AsyncDisposable {
  /** The claim id: the idempotency key, and the id every call addresses. */
  readonly claimId: string;
  /** True when the claim call answered a retry of an earlier one (the same claim). */
  readonly replayed: boolean;
  /** The sandbox's workspace. */
  readonly files: SandboxFiles;
  /** Its processes: start, connect, list, kill. */
  readonly processes: SandboxProcesses;
  private claimValue: Claim | undefined;
  private released = false;

  /** @internal */
  constructor(private readonly ctx: Context, claimId: string, claim?: Claim, replayed = false) {
    this.claimId = claimId;
    this.claimValue = claim;
    this.replayed = replayed;
    this.files = new SandboxFiles(this, ctx);
    this.processes = new SandboxProcesses(ctx, claimId);
  }

  /**
   * Starts `cmd` (default: the sandbox's login shell) on a new pseudo-terminal of
   * `cols` x `rows` (default 80x24) with TERM `term`, attached from its first byte.
   * ResourceExhausted naming --max_ptys when the sandbox has its most terminals open.
   */
  async pty(opts: OpenPtyOptions = {}): Promise<SandboxPty> {
    const p = await this.processes.start(opts.cmd ?? DEFAULT_PTY_CMD, {
      ...opts, background: false, pty: {cols: opts.cols, rows: opts.rows, term: opts.term},
    });
    return p as SandboxPty;
  }

  /**
   * A signed URL through sbx-server's port proxy at which `port` inside this sandbox
   * answers, for anyone holding it, until it expires (`ttl`, default 1 hour, at most 7
   * days). FailedPrecondition when the server runs no port proxy.
   */
  async url(port: number, opts: CallOptions & {ttl?: Duration} = {}): Promise<PortUrl> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new InvalidArgument(grpc.status.INVALID_ARGUMENT, `port ${port} must be an integer in 1..65535`);
    }
    const r = await this.ctx.transport.unary({
      stub: 'sandboxes', method: 'GetPortUrl', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
      idempotent: true, request: {
        claim_id: this.claimId, port,
        ttl: opts.ttl === undefined ? null : toProtoDuration(durationMs(opts.ttl, 'ttl')),
      },
    });
    return {url: r.url, hostUrl: r.host_url ?? '', token: r.token, expiresAt: fromTimestamp(r.expires_at)};
  }

  /**
   * Captures the sandbox's file system (its root's own layer for a sandbox of an image, and
   * its workspace) as a new snapshot of this tenant, durable when this resolves. The
   * sandbox is frozen meanwhile and runs on afterwards (a suspended one stays suspended).
   * Rejects with FailedPrecondition (claim ended; no snapshots folder on the server),
   * ResourceExhausted (the tenant's snapshot quota, naming it; a full disk), NotFound,
   * Unimplemented (Kubernetes). Not retried automatically (a retry would make a second
   * snapshot).
   */
  async snapshot(opts: SnapshotOptions = {}): Promise<Snapshot> {
    const r = await this.ctx.transport.unary({
      stub: 'snapshots', method: 'CreateSnapshot', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
      idempotent: false, request: {claim_id: this.claimId, name: opts.name ?? '', labels: opts.labels ?? {}},
    });
    return toSnapshot(r.snapshot, r.dropped_entries);
  }

  /**
   * Rewinds the sandbox to `snapshot` (a Snapshot or its id, of this tenant, taken on the
   * sandbox's image): every process is killed and it starts again with the same claim,
   * sandbox id and endpoint, its root layer and workspace replaced by the snapshot's.
   * Resolves once it serves again. Rejects with NotFound (the claim or the snapshot is not
   * this tenant's), FailedPrecondition (claim ended; a snapshot of another image, naming
   * both), Unavailable / DeadlineExceeded / Internal (the new start failed after the old
   * processes were killed: the claim is then lost). Not retried automatically.
   */
  async reset(snapshot: Snapshot | string, opts: CallOptions = {}): Promise<void> {
    const id = snapshotIdOf(snapshot, 'reset');
    await this.ctx.transport.unary({
      stub: 'snapshots', method: 'Reset', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
      idempotent: false, request: {claim_id: this.claimId, snapshot_id: id},
    });
  }

  /** The claim as last returned by the server (undefined for a handle made from an id). */
  get claim(): Claim | undefined {
    return this.claimValue;
  }

  /** The server's id of the sandbox, once known. */
  get sandboxId(): string | undefined {
    return this.claimValue?.sandbox.id;
  }

  /**
   * Runs a command and collects its output. A string runs through `sh -c`; an array is
   * executed directly. A command that fails still resolves (look at `exitCode`,
   * `signal`, `timedOut`); the promise rejects only when the command could not run
   * (FailedPrecondition: claim ended, sandbox suspended, argv[0] not found...). Never
   * retried automatically.
   */
  async exec(cmd: string | readonly string[], opts: ExecCollectOptions = {}): Promise<ExecResult> {
    const p = this.execStream(cmd, {...opts, stdin: opts.stdin});
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    for await (const c of p) (c.stream === 'stdout' ? out : err).push(c.data);
    const exit = await p.exit;
    const {pid} = await p.started;
    const stdoutBuffer = Buffer.concat(out);
    const stderrBuffer = Buffer.concat(err);
    return {...exit, pid, stdoutBuffer, stderrBuffer, stdout: stdoutBuffer.toString('utf8'),
            stderr: stderrBuffer.toString('utf8')};
  }

  /**
   * Starts a command and returns it running: iterate it for {@link ExecChunk}s, write its
   * stdin, send it signals, await its `exit`. The call's deadline is the command's
   * `timeout` plus `timeoutMs`.
   */
  execStream(cmd: string | readonly string[], opts: ExecStreamOptions = {}): ExecProcess {
    const argv = typeof cmd === 'string' ? ['sh', '-c', cmd] : [...cmd];
    const timeout = opts.timeout === undefined ? kDefaultExecTimeoutMs : durationMs(opts.timeout, 'timeout');
    const deadline = deadlineOf(this.ctx, opts, timeout || kDefaultExecTimeoutMs);
    const stub = this.ctx.transport.stubs.sandboxes;
    const call = (stub.Exec as (md: grpc.Metadata, o: grpc.CallOptions) => grpc.ClientDuplexStream<Raw, Raw>)
        .call(stub, this.ctx.transport.metadata(), {deadline: new Date(deadline)});
    const attach = opts.stdin !== undefined && opts.stdin !== false;
    const start = {
      claim_id: this.claimId, argv, env: opts.env ?? {}, cwd: opts.cwd ?? '',
      timeout: opts.timeout === undefined ? null : toProtoDuration(timeout),
      max_output_bytes: String(opts.maxOutputBytes ?? 0), attach_stdin: attach,
    };
    const p = new ExecProcess(call, start, opts.signal);
    if (attach && opts.stdin !== true) {
      const data = opts.stdin as string | Uint8Array;
      // Errors surface through the call's status.
      p.write(data).then(() => p.closeStdin()).catch(() => {});
    }
    return p;
  }

  /** Sets the claim's expiry to now + ttl (default: the pool's default_ttl). */
  async renew(ttl?: Duration, opts: CallOptions = {}): Promise<Claim> {
    const res = await this.ctx.transport.unary({
      stub: 'claims', method: 'Renew', deadline: deadlineOf(this.ctx, opts), signal: opts.signal, idempotent: true,
      request: {claim_id: this.claimId, ttl: ttl === undefined ? null : toProtoDuration(durationMs(ttl, 'ttl'))},
    });
    this.claimValue = toClaim(res.claim);
    return this.claimValue;
  }

  /** Freezes every process of the sandbox (its TTL keeps running). Idempotent. */
  async suspend(opts: CallOptions = {}): Promise<SandboxInfo> {
    const res = await this.ctx.transport.unary({
      stub: 'sandboxes', method: 'Suspend', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
      idempotent: true, request: {claim_id: this.claimId},
    });
    return toSandboxInfo(res.sandbox);
  }

  /** Thaws a suspended sandbox. Idempotent. */
  async resume(opts: CallOptions = {}): Promise<SandboxInfo> {
    const res = await this.ctx.transport.unary({
      stub: 'sandboxes', method: 'Resume', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
      idempotent: true, request: {claim_id: this.claimId},
    });
    return toSandboxInfo(res.sandbox);
  }

  /** Reads the claim from the server (in any state). */
  async refresh(opts: CallOptions = {}): Promise<Claim> {
    const res = await this.ctx.transport.unary({
      stub: 'claims', method: 'GetClaim', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
      idempotent: true, request: {claim_id: this.claimId},
    });
    this.claimValue = toClaim(res.claim);
    return this.claimValue;
  }

  /**
   * Ends the claim and destroys the sandbox. Idempotent (retried after UNAVAILABLE);
   * releasing an ended claim resolves with its final state.
   */
  async release(opts: CallOptions = {}): Promise<Claim> {
    const res = await this.ctx.transport.unary({
      stub: 'claims', method: 'Release', deadline: deadlineOf(this.ctx, opts), signal: opts.signal,
      idempotent: true, request: {claim_id: this.claimId},
    });
    this.released = true;
    this.claimValue = toClaim(res.claim);
    return this.claimValue;
  }

  /** Releases the claim unless {@link release} already succeeded (for `await using`). */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.released) await this.release();
  }
}

/**
 * The sandboxes of one {@link Client.claimBatch} call. Iterable; `await using` or
 * {@link release} releases them all.
 */
export class SandboxGroup implements AsyncDisposable, Iterable<Sandbox> {
  /** The batch id (claims are `<batchId>#<i>`). */
  readonly batchId: string;
  /** The sandboxes, ordered by index (best-effort batches may miss some indexes). */
  readonly sandboxes: readonly Sandbox[];
  /** True when the call answered a retry of an earlier, completed batch. */
  readonly replayed: boolean;
  /** For {@link Client.fork}: the snapshot the sandboxes start from; else ''. */
  readonly snapshotId: string;

  /** @internal */
  constructor(batchId: string, sandboxes: Sandbox[], replayed: boolean, snapshotId = '') {
    this.batchId = batchId;
    this.sandboxes = sandboxes;
    this.replayed = replayed;
    this.snapshotId = snapshotId;
  }

  get length(): number {
    return this.sandboxes.length;
  }

  [Symbol.iterator](): Iterator<Sandbox> {
    return this.sandboxes[Symbol.iterator]();
  }

  /**
   * Releases every sandbox (in parallel), also after some releases failed; then rejects
   * with the first failure, if any.
   */
  async release(opts: CallOptions = {}): Promise<void> {
    const results = await Promise.allSettled(this.sandboxes.map((s) => s.release(opts)));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    const results = await Promise.allSettled(this.sandboxes.map((s) => s[Symbol.asyncDispose]()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}

export type {ExecChunk};
