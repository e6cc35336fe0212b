// The connection: one gRPC channel shared by the four sbx.v1 service stubs, per-call
// metadata (bearer token), deadlines, AbortSignals, and retries with backoff + jitter.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import fs from 'node:fs';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

import {abortedError, SbxError, toSbxError, Unavailable, Aborted} from './errors.js';
import type {Raw} from './types.js';

/** Retry settings; the defaults suit interactive use. */
export interface RetryOptions {
  /** Attempts in total, including the first. Default: unlimited (the deadline bounds them). 1 disables retries. */
  maxAttempts?: number;
  /** Backoff before the second attempt, in ms; doubles each time (with jitter). Default 100. */
  initialBackoffMs?: number;
  /** Cap on one backoff, in ms. Default 2000. */
  maxBackoffMs?: number;
}

type Stub = grpc.Client & Record<string, (...args: unknown[]) => unknown>;

export interface Stubs {
  claims: Stub;
  sandboxes: Stub;
  admin: Stub;
  diagnostics: Stub;
  snapshots: Stub;
}

// Protos: the copy the build placed in dist/proto (beside this file's directory).
const kProtoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), 'proto');
let cachedPackage: grpc.GrpcObject | undefined;

function sbxPackage(): grpc.GrpcObject {
  if (cachedPackage) return cachedPackage;
  const dir = path.join(kProtoDir, 'sbx', 'v1');
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.proto')).sort().map((f) => `sbx/v1/${f}`);
  const def = protoLoader.loadSync(files, {
    includeDirs: [kProtoDir], keepCase: true, longs: String, enums: String, defaults: true,
    oneofs: true,
  });
  cachedPackage = grpc.loadPackageDefinition(def);
  return cachedPackage;
}

/** Per-call options every method takes. */
export interface CallOptions {
  /** Cancels the call (and any retry); it then rejects with {@link Cancelled}. */
  signal?: AbortSignal;
  /** Deadline of the call in ms, retries included. Default: the client's `timeoutMs`. */
  timeoutMs?: number;
}

export interface UnaryCall {
  stub: keyof Stubs;
  method: string;
  request: Raw;
  /** Absolute deadline. */
  deadline: number;
  signal?: AbortSignal;
  /** Safe to send again after UNAVAILABLE or ABORTED. */
  idempotent: boolean;
  /** Claim/ClaimBatch: RESOURCE_EXHAUSTED becomes PoolExhausted. */
  claimCall?: boolean;
}

export class Transport {
  readonly stubs: Stubs;
  private readonly channel: grpc.Channel;
  private readonly token: string | undefined;
  private readonly retry: Required<RetryOptions>;
  private closed = false;

  constructor(target: string, credentials: grpc.ChannelCredentials, channelOptions: grpc.ChannelOptions,
              token: string | undefined, retry: RetryOptions | undefined) {
    this.channel = new grpc.Channel(target, credentials, channelOptions);
    const pkg = sbxPackage();
    const v1 = (pkg.sbx as grpc.GrpcObject).v1 as grpc.GrpcObject;
    const make = (name: string) => {
      const Ctor = v1[name] as grpc.ServiceClientConstructor;
      return new Ctor(target, credentials, {channelOverride: this.channel}) as unknown as Stub;
    };
    this.stubs = {
      claims: make('ClaimService'), sandboxes: make('SandboxService'), admin: make('AdminService'),
      diagnostics: make('DiagnosticsService'), snapshots: make('Snapshots'),
    };
    this.token = token;
    this.retry = {
      maxAttempts: Math.max(1, retry?.maxAttempts ?? Infinity),
      initialBackoffMs: retry?.initialBackoffMs ?? 100,
      maxBackoffMs: retry?.maxBackoffMs ?? 2000,
    };
  }

  metadata(): grpc.Metadata {
    const md = new grpc.Metadata();
    if (this.token) md.set('authorization', `Bearer ${this.token}`);
    return md;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const s of Object.values(this.stubs)) (s as grpc.Client).close();
    this.channel.close();
  }

  /** One attempt of a unary call. */
  private once(c: UnaryCall): Promise<Raw> {
    return new Promise((resolve, reject) => {
      if (c.signal?.aborted) {
        reject(abortedError(c.signal.reason));
        return;
      }
      const stub = this.stubs[c.stub];
      const fn = stub[c.method] as (...a: unknown[]) => grpc.ClientUnaryCall;
      let onAbort: (() => void) | undefined;
      const call = fn.call(stub, c.request, this.metadata(), {deadline: new Date(c.deadline)},
                           (err: grpc.ServiceError | null, res: Raw) => {
        if (onAbort) c.signal?.removeEventListener('abort', onAbort);
        if (err) {
          reject(toSbxError(err, {claimCall: c.claimCall, abortReason: c.signal?.aborted ? c.signal.reason : undefined}));
        } else {
          resolve(res);
        }
      });
      if (c.signal) {
        onAbort = () => call.cancel();
        c.signal.addEventListener('abort', onAbort, {once: true});
      }
    });
  }

  /**
   * A unary call, retried (when `idempotent`) after UNAVAILABLE or ABORTED with
   * exponential backoff (each delay random in [cap/2, cap]), as long as the next attempt starts before the
   * deadline; the last error is thrown when the next attempt would start after it.
   */
  async unary(c: UnaryCall): Promise<Raw> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.once(c);
      } catch (e) {
        const retriable = e instanceof Unavailable || e instanceof Aborted;
        if (!c.idempotent || !retriable || attempt >= this.retry.maxAttempts) throw e;
        const cap = Math.min(this.retry.maxBackoffMs, this.retry.initialBackoffMs * 2 ** (attempt - 1));
        const delay = cap / 2 + Math.random() * cap / 2;
        if (Date.now() + delay >= c.deadline) throw e;
        await sleep(delay, c.signal);
      }
    }
  }
}

/** Resolves after `ms`, or rejects with Cancelled when the signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortedError(signal.reason));
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortedError(signal!.reason));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, {once: true});
  });
}

/**
 * Iterates a server stream's messages, converting its error to an SbxError; ending the
 * iteration early (break, return, the signal) cancels the call.
 */
export async function* iterateStream(call: grpc.ClientReadableStream<Raw>, signal?: AbortSignal): AsyncGenerator<Raw> {
  let onAbort: (() => void) | undefined;
  if (signal) {
    onAbort = () => call.cancel();
    signal.addEventListener('abort', onAbort, {once: true});
  }
  try {
    for await (const msg of call) yield msg;
  } catch (e) {
    if (e instanceof SbxError) throw e;
    throw toSbxError(e, {abortReason: signal?.aborted ? signal.reason : undefined});
  } finally {
    if (onAbort) signal!.removeEventListener('abort', onAbort);
    call.cancel();
  }
}
