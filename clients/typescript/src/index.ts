/**
 * @sbx/client: the TypeScript SDK of sbx. Start with {@link Client}.
 * @packageDocumentation
 */
import './polyfill.js';

export {Client, DEFAULT_SERVER, Snapshots} from './client.js';
export type {
  ClaimBatchOptions, ClaimFilter, ClaimOptions, ClaimSource, ClientOptions, FileSpec, ForkOptions, WatchClaimsOptions,
} from './client.js';
export {Sandbox, SandboxFiles, SandboxGroup} from './sandbox.js';
export type {ExecCollectOptions, ExecOptions, ExecStreamOptions, PortUrl, SnapshotOptions, WriteFileOptions} from './sandbox.js';
export {DEFAULT_PTY_CMD, SandboxProcess, SandboxProcesses, SandboxPty} from './process.js';
export type {
  OpenPtyOptions, ProcessExit, ProcessInfo, ProcessOutput, ProcessRef, PtyOptions, StartProcessOptions,
} from './process.js';
export {FileWatch} from './streams.js';
export type {FileEvent, TransferOptions, UploadSource} from './streams.js';
export {ExecProcess} from './exec.js';
export type {ExecChunk, ExecExit, ExecResult} from './exec.js';
export type {CallOptions, RetryOptions} from './transport.js';
export type {
  Claim, ClaimEvent, ClaimPriority, ClaimState, Duration, EmptyPoolPolicy, FileInfo, PingResult, Pool,
  PoolStatus, SandboxInfo, SignalName, Snapshot,
} from './types.js';
export {
  Aborted, AlreadyExists, Cancelled, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument,
  NotFound, OutOfRange, PermissionDenied, PoolExhausted, ResourceExhausted, SbxError, Unauthenticated,
  Unavailable, Unimplemented,
} from './errors.js';
export type {StatusCodeName} from './errors.js';
