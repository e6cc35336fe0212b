// Public data types (plain objects, JSON-friendly except for Dates and Buffers) and their
// conversion from the sbx.v1 messages as @grpc/proto-loader decodes them.
import {InvalidArgument} from './errors.js';
import * as grpc from '@grpc/grpc-js';

/**
 * A duration: a number of milliseconds, or a string with units as the CLI takes them
 * (`"300ms"`, `"30s"`, `"10m"`, `"1h30m"`).
 */
export type Duration = number | string;

/** What a claim does when its pool has no warm sandbox (default: the pool's, itself `wait` by default). */
export type EmptyPoolPolicy = 'wait' | 'cold' | 'fail';

/**
 * How urgent a claim is among its own tenant's claims waiting for the same empty pool:
 * every waiting `interactive` one is served before any `normal` one (the default), every
 * `normal` one before any `batch` one. It never lets a tenant overtake another (tenants
 * share an empty pool by weight), and a claim that finds a warm sandbox takes it whatever
 * its priority.
 */
export type ClaimPriority = 'interactive' | 'normal' | 'batch';

/** Lifecycle of a claim; only `active` claims hold a sandbox. */
export type ClaimState = 'active' | 'released' | 'expired' | 'lost' | 'unspecified';

/** A signal for a running command's process group. */
export type SignalName =
  | 'SIGHUP' | 'SIGINT' | 'SIGQUIT' | 'SIGKILL' | 'SIGUSR1' | 'SIGUSR2' | 'SIGTERM' | 'SIGCONT'
  | 'SIGSTOP';

/** Where a claimed sandbox is and whether it runs. */
export interface SandboxInfo {
  /** Server-assigned sandbox id. */
  id: string;
  /** Address of the sandbox's daemon as the server sees it (informational). */
  endpoint: string;
  /** Kubernetes node, empty for the local runtime. */
  node: string;
  /** True while suspended. */
  suspended: boolean;
}

/** A claim: one tenant holding one sandbox of one pool. */
export interface Claim {
  claimId: string;
  pool: string;
  /** Tenant that owns it ("anonymous" with auth off). */
  owner: string;
  sandbox: SandboxInfo;
  /** `warm`: taken from the pool; `cold`: created for this claim. */
  launchType: 'warm' | 'cold' | 'unspecified';
  state: ClaimState;
  labels: Record<string, string>;
  createdAt: Date | null;
  /** null when the claim has no TTL. */
  expiresAt: Date | null;
  /** null while active. */
  endedAt: Date | null;
  /** The batch it belongs to, "" for a single claim. */
  batchId: string;
  /** Revision of its last change (the sequence watchClaims resumes from). */
  revision: number;
}

/** One change to a claim, from {@link Client.watchClaims}. */
export interface ClaimEvent {
  type: 'added' | 'modified' | 'deleted';
  claim: Claim;
  revision: number;
  /** True for the ADDED events of the initial state. */
  initial: boolean;
}

/** A pool's current numbers. */
export interface PoolStatus {
  warm: number;
  starting: number;
  claimed: number;
  target: number;
  waitingClaims: number;
  stale: number;
  lastError: string;
  updatedAt: Date | null;
}

/** A warm pool, its spec and status. */
export interface Pool {
  name: string;
  template: string;
  minWarm: number;
  maxWarm: number;
  emptyPoolPolicy: EmptyPoolPolicy | 'unspecified';
  /** Milliseconds; 0 means the server's default (30 s). */
  defaultWaitMs: number;
  /** Milliseconds; 0 means claims do not expire by default. */
  defaultTtlMs: number;
  /** Milliseconds; 0 means no bound. */
  maxTtlMs: number;
  /** How a claim picks among warm sandboxes: 'fifo', 'spread' or 'pack' ('' : the server's default). */
  selectionPolicy: string;
  maxSandboxes: number;
  generation: number;
  createdAt: Date | null;
  status: PoolStatus;
}

/** An entry of {@link SandboxFiles.list}. */
export interface FileInfo {
  /** Relative to the workspace (not to the listed directory). */
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  size: number;
  mode: number;
  modifiedAt: Date | null;
}

/** Result of {@link Client.ping}. */
export interface PingResult {
  serverVersion: string;
  serverCommit: string;
  serverTime: Date | null;
}

// ---------------------------------------------------------------------------------------
// Conversions (internal).

/** A message as proto-loader decodes it (keepCase, longs and enums as strings). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Raw = any;

const kUnitMs: Record<string, number> = {ms: 1, s: 1000, m: 60000, h: 3600000};

/** Milliseconds of a Duration; throws InvalidArgument for a malformed one. */
export function durationMs(d: Duration, what: string): number {
  if (typeof d === 'number') {
    if (!Number.isFinite(d) || d < 0) throw invalid(`${what} ${d} is not a non-negative number of milliseconds`);
    return d;
  }
  const s = d.trim();
  let total = 0;
  let rest = s;
  const re = /^(\d+(?:\.\d+)?)(ms|h|m|s)/;
  if (rest === '') throw invalid(`${what} "${d}" is empty`);
  while (rest !== '') {
    const m = re.exec(rest);
    if (!m) throw invalid(`${what} "${d}" is not a duration like 300ms, 30s, 10m or 1h30m`);
    total += Number(m[1]) * kUnitMs[m[2]!]!;
    rest = rest.slice(m[0].length);
  }
  return total;
}

function invalid(message: string): InvalidArgument {
  return new InvalidArgument(grpc.status.INVALID_ARGUMENT, message);
}

/** google.protobuf.Duration of a number of milliseconds. */
export function toProtoDuration(ms: number): {seconds: string; nanos: number} {
  const whole = Math.floor(ms / 1000);
  return {seconds: String(whole), nanos: Math.round((ms - whole * 1000) * 1e6)};
}

export function fromProtoDuration(d: Raw): number {
  if (!d) return 0;
  return Number(d.seconds ?? 0) * 1000 + Number(d.nanos ?? 0) / 1e6;
}

export function fromTimestamp(t: Raw): Date | null {
  if (!t) return null;
  return new Date(Number(t.seconds ?? 0) * 1000 + Math.floor(Number(t.nanos ?? 0) / 1e6));
}

function lowerEnum(value: unknown, prefix: string): string {
  const s = String(value ?? '');
  return s.startsWith(prefix) ? s.slice(prefix.length).toLowerCase() : 'unspecified';
}

/**
 * A snapshot (the Snapshots service): the file system of a claimed sandbox captured as a
 * read-only layer, owned by the tenant that made it. Make one with
 * {@link Sandbox.snapshot}; use it with {@link Sandbox.reset} and {@link Client.fork}.
 */
export interface Snapshot {
  /** The server's id: "sn-" and 16 characters of [a-z0-9]. */
  id: string;
  /** The caller's name (not unique). */
  name: string;
  labels: Record<string, string>;
  /** The tenant that made it. */
  owner: string;
  /** The claim it was taken from. */
  sourceClaimId: string;
  /** The digest of the image the sandbox's root lies on; '' for a sandbox of the host's root (only its workspace is kept). */
  parentImageDigest: string;
  /** The snapshot the sandbox itself started from; '' when none. */
  parentSnapshotId: string;
  /** Bytes of its files (what the tenant's quota counts). */
  sizeBytes: number;
  createdAt: Date | null;
  /** Sockets and device nodes left out; known only on the result of {@link Sandbox.snapshot}, else 0. */
  droppedEntries: number;
}

export function toSnapshot(s: Raw, droppedEntries: unknown = 0): Snapshot {
  return {
    id: s?.id ?? '', name: s?.name ?? '', labels: {...(s?.labels ?? {})}, owner: s?.owner ?? '',
    sourceClaimId: s?.source_claim_id ?? '', parentImageDigest: s?.parent_image_digest ?? '',
    parentSnapshotId: s?.parent_snapshot_id ?? '', sizeBytes: Number(s?.size_bytes ?? 0),
    createdAt: fromTimestamp(s?.create_time), droppedEntries: Number(droppedEntries ?? 0),
  };
}

export function toSandboxInfo(s: Raw): SandboxInfo {
  return {id: s?.id ?? '', endpoint: s?.endpoint ?? '', node: s?.node ?? '', suspended: !!s?.suspended};
}

export function toClaim(c: Raw): Claim {
  return {
    claimId: c.claim_id,
    pool: c.pool,
    owner: c.owner,
    sandbox: toSandboxInfo(c.sandbox),
    launchType: lowerEnum(c.launch_type, 'LAUNCH_TYPE_') as Claim['launchType'],
    state: lowerEnum(c.state, 'CLAIM_STATE_') as ClaimState,
    labels: {...(c.labels ?? {})},
    createdAt: fromTimestamp(c.created_at),
    expiresAt: fromTimestamp(c.expires_at),
    endedAt: fromTimestamp(c.ended_at),
    batchId: c.batch_id ?? '',
    revision: Number(c.revision ?? 0),
  };
}

export function toClaimEvent(e: Raw): ClaimEvent {
  return {
    type: lowerEnum(e.type, 'WATCH_EVENT_TYPE_') as ClaimEvent['type'],
    claim: toClaim(e.claim ?? {}),
    revision: Number(e.revision ?? 0),
    initial: !!e.initial,
  };
}

export function toPool(p: Raw): Pool {
  const s = p.status ?? {};
  return {
    name: p.name,
    template: p.template,
    minWarm: p.min_warm,
    maxWarm: p.max_warm,
    emptyPoolPolicy: lowerEnum(p.empty_pool_policy, 'EMPTY_POOL_POLICY_') as Pool['emptyPoolPolicy'],
    defaultWaitMs: fromProtoDuration(p.default_wait),
    defaultTtlMs: fromProtoDuration(p.default_ttl),
    maxTtlMs: fromProtoDuration(p.max_ttl),
    selectionPolicy: p.selection_policy ?? '',
    maxSandboxes: p.max_sandboxes,
    generation: Number(p.generation ?? 0),
    createdAt: fromTimestamp(p.created_at),
    status: {
      warm: s.warm ?? 0,
      starting: s.starting ?? 0,
      claimed: s.claimed ?? 0,
      target: s.target ?? 0,
      waitingClaims: s.waiting_claims ?? 0,
      stale: s.stale ?? 0,
      lastError: s.last_error ?? '',
      updatedAt: fromTimestamp(s.updated_at),
    },
  };
}

export function toFileInfo(f: Raw): FileInfo {
  const types: Record<string, FileInfo['type']> = {
    FILE_TYPE_REGULAR: 'file', FILE_TYPE_DIRECTORY: 'directory', FILE_TYPE_SYMLINK: 'symlink',
  };
  return {
    path: f.path,
    type: types[f.type] ?? 'other',
    size: Number(f.size ?? 0),
    mode: f.mode ?? 0,
    modifiedAt: fromTimestamp(f.modified_at),
  };
}
