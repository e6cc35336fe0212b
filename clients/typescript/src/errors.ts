// Typed errors: every failed call rejects with an SbxError subclass chosen by the gRPC
// status code, keeping the server's message (which names the offending value).
import * as grpc from '@grpc/grpc-js';

/** Name of a gRPC status code, e.g. `"NOT_FOUND"`. */
export type StatusCodeName =
  | 'OK' | 'CANCELLED' | 'UNKNOWN' | 'INVALID_ARGUMENT' | 'DEADLINE_EXCEEDED' | 'NOT_FOUND'
  | 'ALREADY_EXISTS' | 'PERMISSION_DENIED' | 'RESOURCE_EXHAUSTED' | 'FAILED_PRECONDITION'
  | 'ABORTED' | 'OUT_OF_RANGE' | 'UNIMPLEMENTED' | 'INTERNAL' | 'UNAVAILABLE' | 'DATA_LOSS'
  | 'UNAUTHENTICATED';

/** Base class of every error the SDK throws for a failed call. */
export class SbxError extends Error {
  /** The gRPC status code's name, e.g. `"NOT_FOUND"`. */
  readonly code: StatusCodeName;
  /** The numeric gRPC status code. */
  readonly grpcCode: number;
  /** The server's message alone (`message` is `"<CODE>: <details>"`). */
  readonly details: string;

  constructor(grpcCode: number, details: string, options?: {cause?: unknown}) {
    const code = (grpc.status[grpcCode] ?? 'UNKNOWN') as StatusCodeName;
    super(`${code}: ${details}`, options);
    this.name = new.target.name;
    this.code = code;
    this.grpcCode = grpcCode;
    this.details = details;
  }
}

/** INVALID_ARGUMENT: the request itself is wrong; retrying it fails again. */
export class InvalidArgument extends SbxError {}
/** NOT_FOUND: no such pool, claim (or another tenant's claim), file or directory. */
export class NotFound extends SbxError {}
/** ALREADY_EXISTS: a claim or batch id reused with different parameters. */
export class AlreadyExists extends SbxError {}
/** PERMISSION_DENIED: a valid token that may not do this (e.g. a tenant listing pools). */
export class PermissionDenied extends SbxError {}
/** UNAUTHENTICATED: missing or invalid token. */
export class Unauthenticated extends SbxError {}
/** FAILED_PRECONDITION: the claim has ended, the sandbox is suspended, the command cannot start... */
export class FailedPrecondition extends SbxError {}
/** ABORTED: a lost race; the SDK retries it where that is safe. */
export class Aborted extends SbxError {}
/** UNAVAILABLE: transient trouble; the SDK retries it where that is safe. */
export class Unavailable extends SbxError {}
/** DEADLINE_EXCEEDED: the call's deadline (or a claim's wait) passed. */
export class DeadlineExceeded extends SbxError {}
/** CANCELLED: the call was cancelled, e.g. by its AbortSignal (then `cause` is the signal's reason). */
export class Cancelled extends SbxError {}
/** OUT_OF_RANGE: e.g. a watch's start revision the server no longer keeps. */
export class OutOfRange extends SbxError {}
/** UNIMPLEMENTED: the server does not implement this method. */
export class Unimplemented extends SbxError {}
/** INTERNAL and other codes: a bug on the server; the message says what. */
export class Internal extends SbxError {}

/**
 * RESOURCE_EXHAUSTED: a limit was reached (concurrent execs, a full workspace, an
 * oversized request). `retryAfterMs` is the server's hint, when it sent one.
 */
export class ResourceExhausted extends SbxError {
  /** Milliseconds after which a retry is likely to succeed (`sbx-retry-after-ms`), if sent. */
  readonly retryAfterMs: number | undefined;
  constructor(grpcCode: number, details: string, retryAfterMs: number | undefined,
              options?: {cause?: unknown}) {
    super(grpcCode, details, options);
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * RESOURCE_EXHAUSTED from Claim or ClaimBatch: no sandbox to give (policy fail on an
 * empty pool, or a pool at max_sandboxes). Wait `retryAfterMs` plus jitter, then retry.
 */
export class PoolExhausted extends ResourceExhausted {}

const kByCode: Record<number, new (code: number, details: string, options?: {cause?: unknown}) => SbxError> = {
  [grpc.status.INVALID_ARGUMENT]: InvalidArgument,
  [grpc.status.NOT_FOUND]: NotFound,
  [grpc.status.ALREADY_EXISTS]: AlreadyExists,
  [grpc.status.PERMISSION_DENIED]: PermissionDenied,
  [grpc.status.UNAUTHENTICATED]: Unauthenticated,
  [grpc.status.FAILED_PRECONDITION]: FailedPrecondition,
  [grpc.status.ABORTED]: Aborted,
  [grpc.status.UNAVAILABLE]: Unavailable,
  [grpc.status.DEADLINE_EXCEEDED]: DeadlineExceeded,
  [grpc.status.CANCELLED]: Cancelled,
  [grpc.status.OUT_OF_RANGE]: OutOfRange,
  [grpc.status.UNIMPLEMENTED]: Unimplemented,
};

/** Reads the `sbx-retry-after-ms` trailer, if present and a number. */
function retryAfter(metadata: grpc.Metadata | undefined): number | undefined {
  const v = metadata?.get('sbx-retry-after-ms')[0];
  if (v === undefined) return undefined;
  const n = Number(v.toString());
  return Number.isFinite(n) && n >= 0 ? n : undefined;
}

/**
 * Converts what grpc-js rejects with into an SbxError. `claimCall` marks Claim and
 * ClaimBatch, whose RESOURCE_EXHAUSTED is a PoolExhausted.
 */
export function toSbxError(err: unknown, opts: {claimCall?: boolean; abortReason?: unknown} = {}): SbxError {
  if (err instanceof SbxError) return err;
  const e = err as Partial<grpc.ServiceError> | undefined;
  if (e === undefined || e === null || typeof e.code !== 'number') {
    return new Internal(grpc.status.INTERNAL, String((err as Error)?.message ?? err), {cause: err});
  }
  const details = e.details ?? e.message ?? '';
  if (e.code === grpc.status.CANCELLED && opts.abortReason !== undefined) {
    return new Cancelled(e.code, 'the call was aborted by its AbortSignal', {cause: opts.abortReason});
  }
  if (e.code === grpc.status.RESOURCE_EXHAUSTED) {
    const Cls = opts.claimCall ? PoolExhausted : ResourceExhausted;
    return new Cls(e.code, details, retryAfter(e.metadata), {cause: err});
  }
  const Cls = kByCode[e.code] ?? Internal;
  return new Cls(e.code, details, {cause: err});
}

/** The error thrown when a signal is already aborted before a call starts. */
export function abortedError(reason: unknown): Cancelled {
  return new Cancelled(grpc.status.CANCELLED, 'the call was aborted by its AbortSignal', {cause: reason});
}
