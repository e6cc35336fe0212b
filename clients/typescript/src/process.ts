// Processes that outlive a call: sb.processes (SandboxProcesses), the SandboxProcess
// handle and SandboxPty (a process on a pseudo-terminal), over StartProcess,
// ConnectProcess, ListProcesses, SendProcessInput, CloseProcessInput, SignalProcess,
// ResizeProcess and WaitProcess.
import * as grpc from '@grpc/grpc-js';

import {DeadlineExceeded, Internal, InvalidArgument, NotFound, SbxError} from './errors.js';
import {iterateStream, type CallOptions} from './transport.js';
import {fromProtoDuration, fromTimestamp, type Raw, type SignalName} from './types.js';
import type {Context} from './sandbox.js';

/** A process is named by its pid (number) or its tag (string). */
export type ProcessRef = number | string;

/** Output of a process as it arrives. */
export interface ProcessOutput {
  /** 'stdout', 'stderr', 'pty' (a PTY's terminal), or 'dropped' (then `data` is empty). */
  stream: 'stdout' | 'stderr' | 'pty' | 'dropped';
  data: Buffer;
  /** For 'dropped': bytes missing here (this reader fell more than the replay buffer behind). */
  dropped: number;
}

/** How a process ended. */
export interface ProcessExit {
  /** Exit status 0-255, or null when a signal killed it. */
  exitCode: number | null;
  /** The signal number that killed it, or null. */
  signal: number | null;
  endedAt: Date | null;
  durationMs: number;
  /** Bytes it wrote in all, dropped ones included. */
  outputBytes: number;
  /** Bytes dropped from its replay buffer before every reader had them. */
  droppedBytes: number;
}

/** A process as {@link SandboxProcesses.list} reports it. */
export interface ProcessInfo {
  pid: number;
  tag: string;
  argv: string[];
  cwd: string;
  /** The terminal's size for a PTY process, else null. */
  pty: {cols: number; rows: number} | null;
  stdinOpen: boolean;
  startedAt: Date | null;
  /** Set once it has ended. */
  exit: ProcessExit | null;
  readers: number;
  outputBytes: number;
  droppedBytes: number;
  bufferedBytes: number;
  replayBytes: number;
}

/** Options of {@link SandboxProcesses.start}. */
export interface StartProcessOptions extends CallOptions {
  /**
   * true (default): the start call ends at once and the output waits in the replay
   * buffer until something reads it; false: the handle stays attached from the first byte.
   */
  background?: boolean;
  /** A name to find it again: 1-64 of [A-Za-z0-9._-], unique among running processes. */
  tag?: string;
  env?: Record<string, string>;
  /** Working directory relative to the workspace. */
  cwd?: string;
  /** true: stdin is a pipe fed by sendStdin until closeStdin. Default /dev/null. */
  stdin?: boolean;
  /** Run on a pseudo-terminal (true: 80x24). */
  pty?: boolean | PtyOptions;
  /** Size of its replay buffer in bytes (default 1 MiB). */
  replayBytes?: number;
}

/** A terminal's size and TERM. */
export interface PtyOptions {
  cols?: number;
  rows?: number;
  /** TERM (default 'xterm'). */
  term?: string;
}

/** Options of {@link Sandbox.pty}. */
export interface OpenPtyOptions extends PtyOptions, CallOptions {
  /** The command; default the sandbox's login shell (as `sbx shell`). */
  cmd?: string | readonly string[];
  tag?: string;
  env?: Record<string, string>;
  cwd?: string;
}

/** The command sb.pty() runs without `cmd`: the login shell, as `sbx shell` does. */
export const DEFAULT_PTY_CMD: readonly string[] =
    ['/bin/sh', '-c', 's="${SHELL:-/bin/sh}"; [ -x "$s" ] || s=/bin/sh; exec "$s" -l'];

const kInputChunk = 1024 * 1024;
const kWaitSliceMs = 60_000;
const kSignals = new Set(['SIGHUP', 'SIGINT', 'SIGQUIT', 'SIGKILL', 'SIGUSR1', 'SIGUSR2', 'SIGTERM', 'SIGCONT',
                          'SIGSTOP']);

function invalid(message: string): InvalidArgument {
  return new InvalidArgument(grpc.status.INVALID_ARGUMENT, message);
}

/** @internal */
export function selector(ref: ProcessRef): Raw {
  if (typeof ref === 'number') {
    if (!Number.isInteger(ref) || ref < 1) throw invalid(`pid ${ref} must be an integer of 1 or more`);
    return {pid: ref};
  }
  if (typeof ref !== 'string' || ref === '') throw invalid(`a process is named by its pid or a non-empty tag, not ${String(ref)}`);
  return {tag: ref};
}

function signalValue(sig: SignalName): string {
  if (!kSignals.has(sig)) throw invalid(`signal ${sig} is not one of ${[...kSignals].join(', ')}`);
  return `SIGNAL_${sig.slice(3)}`;
}

function argvOf(cmd: string | readonly string[]): string[] {
  if (typeof cmd === 'string') return ['sh', '-c', cmd];
  if (cmd.length === 0) throw invalid('the command is empty');
  return [...cmd];
}

function toExit(x: Raw): ProcessExit {
  return {
    exitCode: x.status === 'exit_code' ? x.exit_code : null,
    signal: x.status === 'signal' ? x.signal : null,
    endedAt: fromTimestamp(x.ended_at),
    durationMs: fromProtoDuration(x.duration),
    outputBytes: Number(x.output_bytes ?? 0),
    droppedBytes: Number(x.dropped_bytes ?? 0),
  };
}

function toInfo(p: Raw): ProcessInfo {
  return {
    pid: p.pid, tag: p.tag ?? '', argv: [...(p.argv ?? [])], cwd: p.cwd ?? '',
    pty: p.pty ? {cols: p.pty.cols, rows: p.pty.rows} : null,
    stdinOpen: !!p.stdin_open, startedAt: fromTimestamp(p.started_at),
    exit: p.exit ? toExit(p.exit) : null, readers: p.readers ?? 0,
    outputBytes: Number(p.output_bytes ?? 0), droppedBytes: Number(p.dropped_bytes ?? 0),
    bufferedBytes: Number(p.buffered_bytes ?? 0), replayBytes: Number(p.replay_bytes ?? 0),
  };
}

function toOutput(ev: Raw): ProcessOutput | null {
  switch (ev.kind) {
    case 'stdout':
    case 'stderr':
    case 'pty':
      return {stream: ev.kind, data: Buffer.from(ev[ev.kind]), dropped: 0};
    case 'dropped':
      return {stream: 'dropped', data: Buffer.alloc(0), dropped: Number(ev.dropped.bytes ?? 0)};
    default:
      return null;
  }
}

function deadline(ctx: Context, opts: CallOptions | undefined): number {
  return Date.now() + (opts?.timeoutMs ?? ctx.timeoutMs);
}

/** @internal The calls a handle makes, by claim and selector. */
class ProcessCalls {
  constructor(readonly ctx: Context, readonly claimId: string) {}

  async send(sel: Raw, data: string | Uint8Array, opts?: CallOptions): Promise<void> {
    const buf = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    for (let off = 0; off === 0 || off < buf.length; off += kInputChunk) {
      await this.ctx.transport.unary({
        stub: 'sandboxes', method: 'SendProcessInput', deadline: deadline(this.ctx, opts), signal: opts?.signal,
        idempotent: false, request: {claim_id: this.claimId, process: sel, data: buf.subarray(off, off + kInputChunk)},
      });
      if (buf.length === 0) break;
    }
  }

  async signal(sel: Raw, sig: SignalName, opts?: CallOptions): Promise<void> {
    await this.ctx.transport.unary({
      stub: 'sandboxes', method: 'SignalProcess', deadline: deadline(this.ctx, opts), signal: opts?.signal,
      idempotent: false, request: {claim_id: this.claimId, process: sel, signal: signalValue(sig)},
    });
  }

  /** WaitProcess in slices of a minute until it ends, or until `timeoutMs` (DeadlineExceeded). */
  async wait(sel: Raw, opts: {timeoutMs?: number; signal?: AbortSignal} = {}): Promise<ProcessExit> {
    const end = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
    for (;;) {
      const slice = Math.min(kWaitSliceMs, end - Date.now());
      if (slice <= 0) throw new DeadlineExceeded(grpc.status.DEADLINE_EXCEEDED, `the process did not end within ${opts.timeoutMs} ms`);
      try {
        const r = await this.ctx.transport.unary({
          stub: 'sandboxes', method: 'WaitProcess', deadline: Date.now() + slice, signal: opts.signal,
          idempotent: true, request: {claim_id: this.claimId, process: sel},
        });
        return toExit(r.exit);
      } catch (e) {
        if (!(e instanceof DeadlineExceeded) || Date.now() >= end) throw e;
      }
    }
  }
}

/**
 * A process of a sandbox: `pid`, `tag`, `startedAt`, and `exitStatus` once this handle
 * saw it end. Iterate it (`for await (const out of proc)`) for its output until it ends,
 * or use {@link stdout} / {@link stderr}; one reader per handle ({@link SandboxProcesses.connect}
 * gives another). {@link detach} (or `await using`) stops reading; the process keeps
 * running until it ends, is killed, or the claim ends.
 */
export class SandboxProcess implements AsyncIterable<ProcessOutput>, AsyncDisposable {
  readonly pid: number;
  readonly tag: string;
  readonly startedAt: Date | null;
  /** How it ended, once this handle saw it (through its output or {@link wait}). */
  exitStatus: ProcessExit | null = null;
  /** @internal */
  protected readonly calls: ProcessCalls;
  private stream: AsyncGenerator<Raw> | null;
  // The gRPC call under `stream`: detach() cancels it (an async generator's return()
  // would wait for the pending next(), i.e. for the process's next output).
  private call: grpc.ClientReadableStream<Raw> | null;
  private reading = false;

  /** @internal */
  constructor(calls: ProcessCalls, started: Raw, stream: {events: AsyncGenerator<Raw>; call: grpc.ClientReadableStream<Raw>} | null) {
    this.calls = calls;
    this.pid = started.pid;
    this.tag = started.tag ?? '';
    this.startedAt = fromTimestamp(started.started_at);
    this.stream = stream?.events ?? null;
    this.call = stream?.call ?? null;
  }

  /** @internal */
  protected get sel(): Raw {
    return {pid: this.pid};
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<ProcessOutput> {
    if (this.reading) throw new Error('this process handle is already being read; connect() again for another reader');
    this.reading = true;
    try {
      if (!this.stream) {
        if (this.exitStatus) return;
        const stub = this.calls.ctx.transport.stubs.sandboxes;
        const call = (stub.ConnectProcess as (r: Raw, md: grpc.Metadata, o: grpc.CallOptions) => grpc.ClientReadableStream<Raw>)
            .call(stub, {claim_id: this.calls.claimId, process: this.sel}, this.calls.ctx.transport.metadata(), {});
        this.stream = iterateStream(call);
        this.call = call;
      }
      // next() by hand, not `for await`: breaking out of the caller's loop must leave the
      // stream open (a reader that detached and came back would miss what was written in
      // between), so that the next iteration continues where this one stopped.
      const stream = this.stream;
      try {
        for (;;) {
          const r = await stream.next();
          if (r.done) break;
          const ev = r.value;
          const out = toOutput(ev);
          if (out) yield out;
          else if (ev.kind === 'exit') this.exitStatus = toExit(ev.exit);
          // ConnectProcess repeats `started` first: skipped.
        }
      } catch (e) {
        if (!(e instanceof SbxError && e.grpcCode === grpc.status.CANCELLED)) throw e;
      }
      if (this.stream === stream) {  // it ended
        this.stream = null;
        this.call = null;
      }
    } finally {
      this.reading = false;
    }
  }

  /** stdout (or a PTY's output) chunks until the process ends; stderr is skipped. */
  async *stdout(): AsyncGenerator<Buffer> {
    for await (const o of this) if (o.stream === 'stdout' || o.stream === 'pty') yield o.data;
  }

  /** stderr chunks until the process ends; stdout is skipped. */
  async *stderr(): AsyncGenerator<Buffer> {
    for await (const o of this) if (o.stream === 'stderr') yield o.data;
  }

  /**
   * Writes to its stdin pipe (`stdin: true`) or terminal; resolves once the process took
   * the bytes. FailedPrecondition: no stdin, closed, or ended.
   */
  sendStdin(data: string | Uint8Array, opts?: CallOptions): Promise<void> {
    return this.calls.send(this.sel, data, opts);
  }

  /** End of input (after what was sent). FailedPrecondition for a PTY (send "\x04"). */
  async closeStdin(opts?: CallOptions): Promise<void> {
    await this.calls.ctx.transport.unary({
      stub: 'sandboxes', method: 'CloseProcessInput', deadline: deadline(this.calls.ctx, opts), signal: opts?.signal,
      idempotent: true, request: {claim_id: this.calls.claimId, process: this.sel},
    });
  }

  /** Sends a signal (default SIGKILL) to its process group. FailedPrecondition once it ended. */
  async kill(signal: SignalName = 'SIGKILL', opts?: CallOptions): Promise<void> {
    return this.calls.signal(this.sel, signal, opts);
  }

  /**
   * Waits until it ends (WaitProcess; any client may) and resolves with how. `timeoutMs`:
   * DeadlineExceeded after it (the process is not affected); default: as long as it takes.
   */
  async wait(opts: {timeoutMs?: number; signal?: AbortSignal} = {}): Promise<ProcessExit> {
    if (!this.exitStatus) this.exitStatus = await this.calls.wait(this.sel, opts);
    return this.exitStatus;
  }

  /** The process as ListProcesses reports it now. */
  async info(opts?: CallOptions): Promise<ProcessInfo> {
    const all = await new SandboxProcesses(this.calls.ctx, this.calls.claimId).list(opts);
    const me = all.find((p) => p.pid === this.pid);
    if (!me) throw new NotFound(grpc.status.NOT_FOUND, `process ${this.pid} is no longer listed`);
    return me;
  }

  /**
   * Stops reading this handle's output (cancels its stream); the process keeps running.
   * Breaking out of a `for await` over the handle does not: the next loop continues.
   */
  detach(): void {
    const call = this.call;
    this.stream = null;
    this.call = null;
    call?.cancel();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.detach();
  }
}

/**
 * A process on a pseudo-terminal ({@link Sandbox.pty}). Its output comes as 'pty'
 * chunks (the terminal's bytes, "\r\n" line endings); {@link sendInput} sends keystrokes
 * ("\x03" Ctrl-C, "\x04" Ctrl-D); {@link resize} changes the window (SIGWINCH).
 */
export class SandboxPty extends SandboxProcess {
  /** Keystrokes for the terminal; resolves once the terminal took them. */
  sendInput(data: string | Uint8Array, opts?: CallOptions): Promise<void> {
    return this.sendStdin(data, opts);
  }

  /** Sets the window size (1..1000 each). Takes effect before input sent after it resolves. */
  async resize(cols: number, rows: number, opts?: CallOptions): Promise<void> {
    await this.calls.ctx.transport.unary({
      stub: 'sandboxes', method: 'ResizeProcess', deadline: deadline(this.calls.ctx, opts), signal: opts?.signal,
      idempotent: true, request: {claim_id: this.calls.claimId, process: this.sel, size: {cols, rows}},
    });
  }
}

/** The processes of one sandbox (`sb.processes`). */
export class SandboxProcesses {
  private readonly calls: ProcessCalls;

  /** @internal */
  constructor(private readonly ctx: Context, private readonly claimId: string) {
    this.calls = new ProcessCalls(ctx, claimId);
  }

  /**
   * Starts a command (a string runs through `sh -c`, an array is the argv) and resolves
   * with its handle once it runs. Errors are the server's: InvalidArgument, AlreadyExists
   * (tag), FailedPrecondition (program or cwd missing), ResourceExhausted naming the limit.
   */
  async start(cmd: string | readonly string[], opts: StartProcessOptions = {}): Promise<SandboxProcess> {
    const background = opts.background ?? true;
    const pty = opts.pty === true ? {} : opts.pty || null;
    const request = {
      claim_id: this.claimId, argv: argvOf(cmd), env: opts.env ?? {}, cwd: opts.cwd ?? '', tag: opts.tag ?? '',
      stdin: !!opts.stdin, detach: background, replay_bytes: String(opts.replayBytes ?? 0),
      pty: pty ? {size: {cols: pty.cols ?? 80, rows: pty.rows ?? 24}, term: pty.term ?? ''} : null,
    };
    return this.open('StartProcess', request, opts, !background, pty ? SandboxPty : SandboxProcess);
  }

  /**
   * Attaches to a process by pid or tag: iterating the handle gives what it wrote since its
   * last reader (the replay), then its live output, until it ends. NotFound: no such process.
   */
  async connect(ref: ProcessRef, opts: CallOptions = {}): Promise<SandboxProcess> {
    return this.open('ConnectProcess', {claim_id: this.claimId, process: selector(ref)}, opts, true, SandboxProcess);
  }

  /** The sandbox's processes, running and kept ended ones, oldest first. */
  async list(opts: CallOptions = {}): Promise<ProcessInfo[]> {
    const r = await this.ctx.transport.unary({
      stub: 'sandboxes', method: 'ListProcesses', deadline: deadline(this.ctx, opts), signal: opts.signal,
      idempotent: true, request: {claim_id: this.claimId},
    });
    return (r.processes ?? []).map(toInfo);
  }

  /** Sends a signal (default SIGKILL) to the process group of `ref` (pid or tag). */
  async kill(ref: ProcessRef, signal: SignalName = 'SIGKILL', opts?: CallOptions): Promise<void> {
    return this.calls.signal(selector(ref), signal, opts);
  }

  /** Waits for `ref` (pid or tag) to end; see {@link SandboxProcess.wait}. */
  async wait(ref: ProcessRef, opts: {timeoutMs?: number; signal?: AbortSignal} = {}): Promise<ProcessExit> {
    return this.calls.wait(selector(ref), opts);
  }

  /** Writes to the stdin (or terminal) of `ref`. */
  async sendStdin(ref: ProcessRef, data: string | Uint8Array, opts?: CallOptions): Promise<void> {
    return this.calls.send(selector(ref), data, opts);
  }

  private async open<T extends SandboxProcess>(
      method: string, request: Raw, opts: CallOptions, keep: boolean,
      Kind: new (c: ProcessCalls, s: Raw, st: {events: AsyncGenerator<Raw>; call: grpc.ClientReadableStream<Raw>} | null) => T): Promise<T> {
    const stub = this.ctx.transport.stubs.sandboxes;
    const limit = opts.timeoutMs ?? this.ctx.timeoutMs;
    // A stream that stays open has no deadline (a process may run for days); `started`
    // must come within the call timeout.
    const call = (stub[method] as (r: Raw, md: grpc.Metadata, o: grpc.CallOptions) => grpc.ClientReadableStream<Raw>)
        .call(stub, request, this.ctx.transport.metadata(), keep ? {} : {deadline: new Date(Date.now() + limit)});
    const events = iterateStream(call, opts.signal);
    let timedOut = false;
    const timer = setTimeout(() => { timedOut = true; call.cancel(); }, limit);
    let first: IteratorResult<Raw>;
    try {
      first = await events.next();
    } catch (e) {
      if (timedOut) throw new DeadlineExceeded(grpc.status.DEADLINE_EXCEEDED, `no answer from the sandbox within ${limit} ms`);
      throw e;
    } finally {
      clearTimeout(timer);
    }
    if (first.done || first.value.kind !== 'started') {
      void events.return(undefined);
      throw new Internal(grpc.status.INTERNAL, `the process stream began with ${first.done ? 'its end' : first.value.kind}, not started`);
    }
    if (!keep) {
      for await (const _ of events) { /* a detached start ends right after `started` */ }
    }
    return new Kind(this.calls, first.value.started, keep ? {events, call} : null);
  }
}
