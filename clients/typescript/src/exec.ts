// A running command: the Exec bidirectional stream as an async iterator of output
// chunks, with stdin writes, signals and the exit status.
import * as grpc from '@grpc/grpc-js';

import {abortedError, FailedPrecondition, Internal, SbxError, toSbxError} from './errors.js';
import {fromProtoDuration, fromTimestamp, type Raw, type SignalName} from './types.js';

/** A piece of a command's output, in the order the process wrote it (per stream). */
export interface ExecChunk {
  stream: 'stdout' | 'stderr';
  data: Buffer;
}

/** How a command ended. */
export interface ExecExit {
  /** Exit status 0-255, or null when a signal killed the process. */
  exitCode: number | null;
  /** Number of the signal that killed the process (9 after a timeout), or null. */
  signal: number | null;
  /** True when the command's `timeout` passed and it was killed. */
  timedOut: boolean;
  /** True when output beyond `maxOutputBytes` was discarded. */
  truncated: boolean;
  /** Bytes the process wrote to stdout / stderr, discarded ones included. */
  stdoutBytes: number;
  stderrBytes: number;
  /** Wall-clock run time. */
  durationMs: number;
}

/** Result of {@link Sandbox.exec}: the exit status with the collected output. */
export interface ExecResult extends ExecExit {
  /** stdout decoded as UTF-8. */
  stdout: string;
  /** stderr decoded as UTF-8. */
  stderr: string;
  stdoutBuffer: Buffer;
  stderrBuffer: Buffer;
  /** Process id inside the sandbox. */
  pid: number;
}

const kMaxStdinChunk = 1024 * 1024;
// Buffered output above which the stream is paused until the consumer catches up.
const kHighWaterBytes = 4 * 1024 * 1024;

/**
 * A command running in a sandbox ({@link Sandbox.execStream}). Iterate it (`for await`)
 * for its output chunks, or call {@link wait}; one of the two must happen, as output is
 * buffered until read. Breaking out of the iteration, {@link cancel} or the signal
 * cancels the call, which kills the process.
 */
export class ExecProcess implements AsyncIterable<ExecChunk> {
  /** Resolves with the process id once the process runs; rejects if it could not start. */
  readonly started: Promise<{pid: number; startedAt: Date | null}>;
  /** Resolves with the exit status once the call ended; rejects with an SbxError. */
  readonly exit: Promise<ExecExit>;

  private readonly call: grpc.ClientDuplexStream<Raw, Raw>;
  private readonly queue: ExecChunk[] = [];
  private queuedBytes = 0;
  private done = false;
  private error: SbxError | undefined;
  private wake: (() => void) | undefined;
  private iterating = false;
  private halfClosed = false;
  private resolveStarted!: (v: {pid: number; startedAt: Date | null}) => void;
  private rejectStarted!: (e: SbxError) => void;
  private resolveExit!: (v: ExecExit) => void;
  private rejectExit!: (e: SbxError) => void;
  private exitMsg: ExecExit | undefined;
  private readonly signal: AbortSignal | undefined;
  private readonly onAbort: (() => void) | undefined;

  /** @internal */
  constructor(call: grpc.ClientDuplexStream<Raw, Raw>, start: Raw, signal: AbortSignal | undefined) {
    this.call = call;
    this.signal = signal;
    this.started = new Promise((res, rej) => { this.resolveStarted = res; this.rejectStarted = rej; });
    this.exit = new Promise((res, rej) => { this.resolveExit = res; this.rejectExit = rej; });
    // Callers that only look at one of them must not see an unhandled rejection.
    this.started.catch(() => {});
    this.exit.catch(() => {});

    let status: grpc.StatusObject | undefined;
    let ended = false;
    const finish = () => {
      if (!status || (status.code === grpc.status.OK && !ended)) return;
      if (status.code !== grpc.status.OK) {
        this.fail(toSbxError(status, {abortReason: signal?.aborted ? signal.reason : undefined}));
      } else if (!this.exitMsg) {
        this.fail(new Internal(grpc.status.INTERNAL, 'Exec ended OK without an exit message'));
      } else {
        this.done = true;
        this.resolveExit(this.exitMsg);
        this.notify();
      }
      if (this.onAbort) signal!.removeEventListener('abort', this.onAbort);
    };
    call.on('data', (msg: Raw) => this.onMessage(msg));
    call.on('end', () => { ended = true; finish(); });
    call.on('error', () => {});  // reported through 'status'
    call.on('status', (st: grpc.StatusObject) => { status = st; finish(); });
    if (signal) {
      this.onAbort = () => call.cancel();
      signal.addEventListener('abort', this.onAbort, {once: true});
    }
    call.write({start});
    if (signal?.aborted) call.cancel();
  }

  private onMessage(msg: Raw): void {
    switch (msg.kind) {
      case 'started':
        this.resolveStarted({pid: msg.started.pid, startedAt: fromTimestamp(msg.started.started_at)});
        break;
      case 'stdout_chunk':
      case 'stderr_chunk': {
        const data = Buffer.from(msg[msg.kind]);
        this.queue.push({stream: msg.kind === 'stdout_chunk' ? 'stdout' : 'stderr', data});
        this.queuedBytes += data.length;
        if (this.iterating && this.queuedBytes > kHighWaterBytes) this.call.pause();
        this.notify();
        break;
      }
      case 'exit': {
        const x = msg.exit;
        this.exitMsg = {
          exitCode: x.status === 'exit_code' ? x.exit_code : null,
          signal: x.status === 'signal' ? x.signal : null,
          timedOut: !!x.timed_out,
          truncated: !!x.truncated,
          stdoutBytes: Number(x.stdout_bytes ?? 0),
          stderrBytes: Number(x.stderr_bytes ?? 0),
          durationMs: fromProtoDuration(x.duration),
        };
        this.halfClose();
        break;
      }
    }
  }

  private fail(e: SbxError): void {
    this.error = e;
    this.done = true;
    this.rejectStarted(e);
    this.rejectExit(e);
    this.notify();
  }

  private notify(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  private halfClose(): void {
    if (this.halfClosed) return;
    this.halfClosed = true;
    this.call.end();
  }

  private send(msg: Raw): Promise<void> {
    if (this.done || this.halfClosed) {
      return Promise.reject(new FailedPrecondition(grpc.status.FAILED_PRECONDITION, 'the command has ended or its input is closed'));
    }
    return new Promise((resolve, reject) => {
      this.call.write(msg, (err?: Error | null) => (err ? reject(toSbxError(err)) : resolve()));
    });
  }

  /**
   * Writes to the process's stdin (needs `stdin: true` in the options). Resolves once the
   * data was handed to the transport.
   */
  async write(data: string | Uint8Array): Promise<void> {
    const buf = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    for (let off = 0; off < buf.length || off === 0; off += kMaxStdinChunk) {
      await this.send({stdin_chunk: buf.subarray(off, off + kMaxStdinChunk)});
      if (buf.length === 0) break;
    }
  }

  /** Closes the process's stdin (end of input). Signals can still be sent afterwards. */
  closeStdin(): Promise<void> {
    return this.send({close_stdin: {}});
  }

  /** Sends a signal to the process group (default SIGTERM); ignored once it exited. */
  kill(signal: SignalName = 'SIGTERM'): Promise<void> {
    return this.send({signal: {signal: `SIGNAL_${signal.slice(3)}`}});
  }

  /** Cancels the call: the process is killed and `exit` rejects with Cancelled. */
  cancel(): void {
    this.call.cancel();
  }

  /** Reads (and discards) the remaining output and resolves with the exit status. */
  async wait(): Promise<ExecExit> {
    if (!this.iterating) {
      for await (const _ of this) { /* discard */ }
    }
    return this.exit;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<ExecChunk> {
    if (this.iterating) throw new Error('an ExecProcess can be iterated only once');
    this.iterating = true;
    let completed = false;
    try {
      for (;;) {
        const chunk = this.queue.shift();
        if (chunk) {
          this.queuedBytes -= chunk.data.length;
          if (this.queuedBytes <= kHighWaterBytes / 2 && this.call.isPaused()) this.call.resume();
          yield chunk;
          continue;
        }
        if (this.done) {
          if (this.error) throw this.error;
          completed = true;
          return;
        }
        if (this.signal?.aborted) throw abortedError(this.signal.reason);
        await new Promise<void>((r) => { this.wake = r; });
      }
    } finally {
      if (!completed && !this.done) this.call.cancel();
    }
  }
}
