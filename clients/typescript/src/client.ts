// The entry point: a connection to one sbx-server and the calls that are not about one
// sandbox (claim, batches, claims, pools, watch, ping).
import './polyfill.js';

import * as grpc from '@grpc/grpc-js';
import {randomUUID} from 'node:crypto';
import fs from 'node:fs';

import {InvalidArgument} from './errors.js';
import {Sandbox, SandboxGroup, deadlineOf, snapshotIdOf, type Context} from './sandbox.js';
import {iterateStream, Transport, type CallOptions, type RetryOptions} from './transport.js';
import {
  durationMs, toClaim, toClaimEvent, toPool, toProtoDuration, toSnapshot, type Claim, type ClaimEvent,
  type ClaimPriority, type ClaimState, type Duration, type EmptyPoolPolicy, type PingResult, type Pool,
  type Snapshot,
} from './types.js';

/** Default server, as the CLI's. */
export const DEFAULT_SERVER = '127.0.0.1:50051';
// The CLI's default wait, added to a claim's deadline when no wait is given.
const kDefaultPoolWaitMs = 30000;
// The default wait of an image's on-demand pool (its first sandbox pulls the image), added
// to the deadline of a claim by image that gives no wait.
const kDefaultImageWaitMs = 300000;

/** How to reach and authenticate to the server; every field is optional. */
export interface ClientOptions {
  /** host:port. Default: `$SBX_SERVER`, else `127.0.0.1:50051`. */
  server?: string;
  /** Bearer token, sent as `authorization: Bearer TOKEN`. Default: `$SBX_TOKEN`. */
  token?: string;
  /** TLS with the system's roots. Implied by `ca`, `cert` and `key`. Default false. */
  tls?: boolean;
  /** PEM roots to verify the server with: the PEM text (Buffer, or a string holding "-----BEGIN") or a file path. */
  ca?: string | Buffer;
  /** Client certificate for mutual TLS (PEM text or file path, as `ca`). Needs `key`. */
  cert?: string | Buffer;
  /** Client private key for mutual TLS (PEM text or file path, as `ca`). Needs `cert`. */
  key?: string | Buffer;
  /** Name expected in the server's certificate when it differs from the host in `server`. */
  serverName?: string;
  /** Default deadline of each call, ms (claims add their wait, exec its timeout). Default 30000. */
  timeoutMs?: number;
  /** Retries of idempotent calls after UNAVAILABLE / ABORTED. */
  retry?: RetryOptions;
  /** Extra grpc-js channel options. */
  channelOptions?: Record<string, string | number>;
}

/** A file placed in the workspace before the claim returns. */
export interface FileSpec {
  /** Relative to the workspace; missing directories are created. */
  path: string;
  content: string | Uint8Array;
  /** Permission bits, e.g. 0o755. Default 0o644. */
  mode?: number;
}

/**
 * What a claim takes its sandbox from: a pool by name (`'py'` or `{pool: 'py'}`), or
 * `{image: REF}`, a sandbox running that image (see {@link Client.claim}). Exactly one of
 * `pool` and `image`.
 */
export type ClaimSource = string | {pool: string; image?: undefined} | {image: string; pool?: undefined};

/** Options of {@link Client.claim}. */
export interface ClaimOptions extends CallOptions {
  /**
   * The claim id (1-128 of `[A-Za-z0-9._:-]`), the idempotency key: the SDK retries with
   * it, and a later claim with the same id returns the same claim. Default: a new UUID.
   */
  id?: string;
  /** Lifetime without a renew. Default: the pool's default_ttl. */
  ttl?: Duration;
  /** Environment for every command run in the sandbox. */
  env?: Record<string, string>;
  /** Files written before the claim returns (1 MiB in total): a list, or path → content. */
  files?: FileSpec[] | Record<string, string | Uint8Array>;
  /** Labels for selectors. */
  labels?: Record<string, string>;
  /** How long to wait when the pool is empty (policy wait or cold). Default: the pool's default_wait. */
  wait?: Duration;
  /** What to do when the pool is empty. Default: the pool's. */
  policy?: EmptyPoolPolicy;
  /**
   * Place among this tenant's own claims waiting for the empty pool (see
   * {@link ClaimPriority}); a batch's missing sandboxes all wait at it. Default: `normal`.
   */
  priority?: ClaimPriority;
  /**
   * Soft placement preference: node labels, e.g. `{'topology.kubernetes.io/zone':
   * 'europe-west1-b'}`. The claim gets a warm sandbox whose node has all of them if one
   * is warm, any warm sandbox otherwise (never an error for lack of a match); for a batch,
   * each of its sandboxes. Honoured by pools whose selection policy is `spread` or `pack`;
   * the local runtime reports no node labels. Same syntax and limits as `labels`, checked
   * by the server ({@link InvalidArgument} naming the bad key or value). Default: none.
   */
  nodePreference?: Record<string, string>;
}

/** Options of {@link Client.claimBatch}. */
export interface ClaimBatchOptions extends Omit<ClaimOptions, 'id'> {
  /** The batch id (1-120 characters), the idempotency key; claims are `<id>#<i>`. Default: a new UUID. */
  id?: string;
  /** Accept between 1 and `count` sandboxes instead of all or nothing. Default false. */
  bestEffort?: boolean;
}

/** Options of {@link Client.fork}. */
export interface ForkOptions extends CallOptions {
  /**
   * The batch id (1-120 of `[A-Za-z0-9._:-]`), the idempotency key: the forks are
   * `<id>#<i>`, and a retry with it answers the same forks without a new snapshot.
   * Default: a new UUID, made here and reused by every automatic retry.
   */
  id?: string;
  /** Every fork's lifetime without a renew. Default: none. */
  ttl?: Duration;
  /** Every fork's labels. */
  labels?: Record<string, string>;
  /** Environment for every command run in every fork. */
  env?: Record<string, string>;
  /** Files written in every fork's workspace before the call returns (1 MiB in total). */
  files?: FileSpec[] | Record<string, string | Uint8Array>;
  /** How long the server may take to bring every fork up. Default: its 5 minutes (the deadline allows for it). */
  wait?: Duration;
}

// The server's default ForkRequest.wait_timeout, added to a fork's deadline when no wait is given.
const kDefaultForkWaitMs = 300000;

/**
 * The tenant's snapshots (`client.snapshots`). Another tenant's snapshot is NotFound,
 * as an unknown id.
 */
export class Snapshots {
  /** @internal */
  constructor(private readonly ctx: Context) {}

  /** The tenant's snapshots, oldest first; with `labels`, only those carrying all of them. */
  async list(options: CallOptions & {labels?: Record<string, string>} = {}): Promise<Snapshot[]> {
    const res = await this.ctx.transport.unary({
      stub: 'snapshots', method: 'ListSnapshots', deadline: deadlineOf(this.ctx, options), signal: options.signal,
      idempotent: true, request: {label_selector: options.labels ?? {}},
    });
    return (res.snapshots as unknown[]).map((s) => toSnapshot(s));
  }

  /** One snapshot of the tenant. Rejects with NotFound for an unknown id or another tenant's. */
  async get(snapshot: Snapshot | string, options: CallOptions = {}): Promise<Snapshot> {
    const res = await this.ctx.transport.unary({
      stub: 'snapshots', method: 'GetSnapshot', deadline: deadlineOf(this.ctx, options), signal: options.signal,
      idempotent: true, request: {snapshot_id: snapshotIdOf(snapshot, 'snapshots.get')},
    });
    return toSnapshot(res.snapshot);
  }

  /**
   * Deletes a snapshot. Rejects with NotFound (unknown id or another tenant's),
   * FailedPrecondition naming the user while a template, a claimed fork or a live sandbox
   * started from it still uses it. Not retried automatically (a retry after a lost answer
   * would say NotFound).
   */
  async delete(snapshot: Snapshot | string, options: CallOptions = {}): Promise<void> {
    await this.ctx.transport.unary({
      stub: 'snapshots', method: 'DeleteSnapshot', deadline: deadlineOf(this.ctx, options), signal: options.signal,
      idempotent: false, request: {snapshot_id: snapshotIdOf(snapshot, 'snapshots.delete')},
    });
  }
}

/** Which claims {@link Client.listClaims} and {@link Client.watchClaims} return. */
export interface ClaimFilter {
  pool?: string;
  /** Label selector, e.g. `"team=rl,run=7,!debug"`. */
  selector?: string;
  /** Equality requirements on labels. */
  labels?: Record<string, string>;
  /** Another tenant's claims (admin token). */
  owner?: string;
  /** Only these states. Default: any. */
  states?: Exclude<ClaimState, 'unspecified'>[];
}

/** Options of {@link Client.watchClaims}. */
export interface WatchClaimsOptions extends ClaimFilter {
  /**
   * Resume after this revision. Default 0: first an `added` event (initial = true) for
   * every matching claim, then changes.
   */
  startRevision?: number;
  /** Ends the watch (the iteration then rejects with Cancelled). */
  signal?: AbortSignal;
}

const kPolicy: Record<EmptyPoolPolicy, string> = {
  wait: 'EMPTY_POOL_POLICY_WAIT', cold: 'EMPTY_POOL_POLICY_COLD', fail: 'EMPTY_POOL_POLICY_FAIL',
};

const kPriority: Record<ClaimPriority, string> = {
  interactive: 'CLAIM_PRIORITY_INTERACTIVE', normal: 'CLAIM_PRIORITY_NORMAL', batch: 'CLAIM_PRIORITY_BATCH',
};

// Checked here rather than left to the server: proto-loader would send an unknown name as
// the enum's zero (normal), so a typo from JavaScript would pass silently.
function priorityName(p: ClaimPriority | undefined): string {
  if (p === undefined) return 'CLAIM_PRIORITY_UNSPECIFIED';
  if (!Object.hasOwn(kPriority, p)) {
    throw new InvalidArgument(grpc.status.INVALID_ARGUMENT,
        `priority ${JSON.stringify(p)} is not one of "interactive", "normal", "batch"`);
  }
  return kPriority[p];
}

function pem(v: string | Buffer | undefined, what: string): Buffer | null {
  if (v === undefined) return null;
  if (Buffer.isBuffer(v)) return v;
  if (v.includes('-----BEGIN')) return Buffer.from(v);
  try {
    return fs.readFileSync(v);
  } catch (e) {
    throw new Error(`${what} file "${v}" cannot be read: ${(e as Error).message}`);
  }
}

function filterMessage(f: ClaimFilter): Record<string, unknown> {
  return {
    pool: f.pool ?? '', label_selector: f.selector ?? '', match_labels: f.labels ?? {}, owner: f.owner ?? '',
    states: (f.states ?? []).map((s) => `CLAIM_STATE_${s.toUpperCase()}`),
  };
}

function claimFields(opts: ClaimOptions | ClaimBatchOptions): Record<string, unknown> {
  const files: FileSpec[] = Array.isArray(opts.files) ? opts.files :
      Object.entries(opts.files ?? {}).map(([path, content]) => ({path, content}));
  return {
    empty_pool_policy: opts.policy ? kPolicy[opts.policy] : 'EMPTY_POOL_POLICY_UNSPECIFIED',
    priority: priorityName(opts.priority),
    wait_timeout: opts.wait === undefined ? null : toProtoDuration(durationMs(opts.wait, 'wait')),
    ttl: opts.ttl === undefined ? null : toProtoDuration(durationMs(opts.ttl, 'ttl')),
    labels: opts.labels ?? {},
    node_preference: opts.nodePreference ?? {},
    // Only when there is something to deliver (the server ignores an empty one anyway).
    config: Object.keys(opts.env ?? {}).length === 0 && files.length === 0 ? null : {
      env: opts.env ?? {},
      files: files.map((f) => ({
        path: f.path, content: typeof f.content === 'string' ? Buffer.from(f.content) : Buffer.from(f.content),
        mode: f.mode ?? 0,
      })),
    },
  };
}

// The request's pool and image; InvalidArgument unless exactly one is given (checked here:
// proto-loader would send a stray field silently).
function sourceFields(from: ClaimSource): {pool: string; image: string} {
  if (typeof from === 'string') return {pool: from, image: ''};
  const pool = from?.pool ?? '';
  const image = from?.image ?? '';
  if (!pool === !image) {
    throw new InvalidArgument(grpc.status.INVALID_ARGUMENT, pool ?
      `give a pool (${JSON.stringify(pool)}) or an image (${JSON.stringify(image)}), not both` :
      'give a pool, or an image ({image: REF})');
  }
  return {pool, image};
}

/** Time a claim may take: its wait (unless policy fail) plus the call timeout. */
function claimDeadline(ctx: Context, opts: ClaimOptions | ClaimBatchOptions, byImage = false): number {
  const wait = opts.policy === 'fail' ? 0 :
    opts.wait !== undefined ? durationMs(opts.wait, 'wait') : byImage ? kDefaultImageWaitMs : kDefaultPoolWaitMs;
  return deadlineOf(ctx, opts, wait);
}

/**
 * A connection to one sbx-server. Cheap to keep, meant to be shared; {@link close} it
 * when done (or `using client = new Client()`).
 *
 * ```ts
 * const client = new Client();              // $SBX_SERVER, $SBX_TOKEN
 * await using sb = await client.claim('default', {ttl: '10m'});
 * const r = await sb.exec('echo hello');
 * ```
 */
export class Client implements Disposable {
  /** The server's host:port. */
  readonly server: string;
  /** The tenant's snapshots: list, get, delete. */
  readonly snapshots: Snapshots;
  private readonly ctx: Context;

  constructor(options: ClientOptions = {}) {
    this.server = options.server ?? (process.env.SBX_SERVER || DEFAULT_SERVER);
    const token = options.token ?? (process.env.SBX_TOKEN || undefined);
    const ca = pem(options.ca, 'ca');
    const cert = pem(options.cert, 'cert');
    const key = pem(options.key, 'key');
    if ((cert === null) !== (key === null)) throw new Error('cert and key must be given together');
    const tls = !!options.tls || ca !== null || cert !== null;
    const credentials = tls ? grpc.credentials.createSsl(ca, key, cert) : grpc.credentials.createInsecure();
    const channelOptions: grpc.ChannelOptions = {
      // Reconnect promptly after a server restart (grpc-js waits up to 120 s by default).
      'grpc.initial_reconnect_backoff_ms': 250,
      'grpc.max_reconnect_backoff_ms': 5000,
      ...options.channelOptions,
    };
    if (options.serverName) {
      channelOptions['grpc.ssl_target_name_override'] = options.serverName;
      channelOptions['grpc.default_authority'] = options.serverName;
    }
    this.ctx = {
      transport: new Transport(this.server, credentials, channelOptions, token, options.retry),
      timeoutMs: options.timeoutMs ?? 30000,
    };
    this.snapshots = new Snapshots(this.ctx);
  }

  /**
   * Claims a sandbox from a pool (`claim('py')`), or one running an image
   * (`claim({image: 'oci:/images/task-17:v1'})`). Retried with the same claim id after
   * UNAVAILABLE or ABORTED until the deadline (wait + timeoutMs), so a retry never takes
   * a second sandbox.
   *
   * By image, the server takes a pool whose template runs the image (the one with warm
   * sandboxes first), else, on a local server with an image cache, the image's on-demand
   * pool, made and pulled on first use (policy cold unless given; it waits up to 5
   * minutes by default, which the deadline allows for). `sandbox.claim.pool` says which
   * pool served it.
   *
   * Rejects with PoolExhausted (policy fail, with `retryAfterMs`; or, by image, the
   * tenant's image_claim_rate or image_cache_bytes), DeadlineExceeded (no sandbox within
   * `wait`), NotFound (no such pool; by image: no pool runs it and the server makes none,
   * as on Kubernetes), InvalidArgument (also both or neither of pool and image, before any
   * call, and an image reference the server does not take), FailedPrecondition (id of an
   * ended claim; by image: a local server without an image cache), AlreadyExists (id used
   * for another pool), Cancelled.
   */
  async claim(from: ClaimSource, options: ClaimOptions = {}): Promise<Sandbox> {
    const source = sourceFields(from);
    const claimId = options.id ?? randomUUID();
    const res = await this.ctx.transport.unary({
      stub: 'claims', method: 'Claim', deadline: claimDeadline(this.ctx, options, !!source.image),
      signal: options.signal, idempotent: true, claimCall: true,
      request: {claim_id: claimId, ...source, ...claimFields(options)},
    });
    return new Sandbox(this.ctx, res.claim.claim_id, toClaim(res.claim), !!res.replayed);
  }

  /**
   * Claims `count` sandboxes (1-1000) in one call: all or nothing, or with `bestEffort`
   * between 1 and `count`; from a pool or, with `{image}`, from one pool of the image (as
   * {@link claim}). Retried like {@link claim} with the batch id.
   */
  async claimBatch(from: ClaimSource, count: number, options: ClaimBatchOptions = {}): Promise<SandboxGroup> {
    const source = sourceFields(from);
    const batchId = options.id ?? randomUUID();
    const res = await this.ctx.transport.unary({
      stub: 'claims', method: 'ClaimBatch', deadline: claimDeadline(this.ctx, options, !!source.image),
      signal: options.signal, idempotent: true, claimCall: true,
      request: {
        batch_id: batchId, ...source, count,
        mode: options.bestEffort ? 'BATCH_MODE_BEST_EFFORT' : 'BATCH_MODE_ALL_OR_NOTHING',
        ...claimFields(options),
      },
    });
    const sandboxes = (res.claims as unknown[]).map((c) => new Sandbox(this.ctx, (c as {claim_id: string}).claim_id, toClaim(c), !!res.replayed));
    return new SandboxGroup(res.batch_id, sandboxes, !!res.replayed);
  }

  /**
   * `count` new sandboxes (1 to the server's max batch, 1000 by default) whose root layer
   * and workspace start as copies of `source`'s, each then writing only its own. `source`
   * is a {@link Snapshot} or a snapshot id, or a {@link Sandbox} (an active claim of this
   * tenant), whose live state the server snapshots first (kept, counted against the
   * quota; its id is the result's `snapshotId`). All or nothing. Retried after
   * UNAVAILABLE or ABORTED with the same batch id (made here when not given), so a retry
   * answers the same forks and makes no new snapshot.
   *
   * Rejects with NotFound (the snapshot or the sandbox is not this tenant's),
   * FailedPrecondition (the source claim has ended), PoolExhausted (a tenant limit, the
   * snapshot quota, or the wait ran out), InvalidArgument (count, id, ttl, labels),
   * Unimplemented (Kubernetes).
   */
  async fork(source: Snapshot | string | Sandbox, count: number, options: ForkOptions = {}): Promise<SandboxGroup> {
    const from = source instanceof Sandbox ? {claim_id: source.claimId} :
      {snapshot_id: snapshotIdOf(source, 'fork')};
    if (!Number.isInteger(count)) {
      throw new InvalidArgument(grpc.status.INVALID_ARGUMENT, `fork count ${JSON.stringify(count)} must be an integer`);
    }
    const batchId = options.id ?? randomUUID();
    const fields = claimFields(options);
    const res = await this.ctx.transport.unary({
      stub: 'snapshots', method: 'Fork', signal: options.signal, idempotent: true, claimCall: true,
      deadline: deadlineOf(this.ctx, options, options.wait !== undefined ? durationMs(options.wait, 'wait') : kDefaultForkWaitMs),
      request: {
        ...from, count, batch_id: batchId, ttl: fields.ttl, labels: fields.labels, wait_timeout: fields.wait_timeout,
        config: fields.config,
      },
    });
    const sandboxes = (res.claims as unknown[]).map((c) => new Sandbox(this.ctx, (c as {claim_id: string}).claim_id, toClaim(c), !!res.replayed));
    return new SandboxGroup(res.batch_id, sandboxes, !!res.replayed, res.snapshot_id);
  }

  /**
   * A handle on an existing claim, from its id (no call is made): for a claim made
   * earlier or by another process of the same tenant.
   */
  sandbox(claimId: string): Sandbox {
    return new Sandbox(this.ctx, claimId);
  }

  /** Reads one claim, in any state. Rejects with NotFound. */
  async getClaim(claimId: string, options: CallOptions = {}): Promise<Claim> {
    const res = await this.ctx.transport.unary({
      stub: 'claims', method: 'GetClaim', deadline: deadlineOf(this.ctx, options), signal: options.signal,
      idempotent: true, request: {claim_id: claimId},
    });
    return toClaim(res.claim);
  }

  /** Releases a claim by id (idempotent). Same as `client.sandbox(id).release()`. */
  release(claimId: string, options: CallOptions = {}): Promise<Claim> {
    return this.sandbox(claimId).release(options);
  }

  /** Lists the caller's claims matching a filter, every page, ordered by claim id. */
  async listClaims(filter: ClaimFilter & CallOptions = {}): Promise<Claim[]> {
    const deadline = deadlineOf(this.ctx, filter);
    const out: Claim[] = [];
    let token = '';
    do {
      const res = await this.ctx.transport.unary({
        stub: 'claims', method: 'ListClaims', deadline, signal: filter.signal, idempotent: true,
        request: {filter: filterMessage(filter), page_size: 1000, page_token: token},
      });
      for (const c of res.claims) out.push(toClaim(c));
      token = res.next_page_token;
    } while (token);
    return out;
  }

  /** Lists the pools with their status, every page. Needs an admin token (else PermissionDenied). */
  async pools(options: CallOptions & {template?: string} = {}): Promise<Pool[]> {
    const deadline = deadlineOf(this.ctx, options);
    const out: Pool[] = [];
    let token = '';
    do {
      const res = await this.ctx.transport.unary({
        stub: 'admin', method: 'ListPools', deadline, signal: options.signal, idempotent: true,
        request: {page_size: 1000, page_token: token, template: options.template ?? ''},
      });
      for (const p of res.pools) out.push(toPool(p));
      token = res.next_page_token;
    } while (token);
    return out;
  }

  /**
   * Streams changes to claims: `for await (const ev of client.watchClaims({pool}))`.
   * Runs until the loop breaks, the signal aborts or the server ends it (rejecting with
   * Unavailable at shutdown, OutOfRange for a revision no longer kept; resume with
   * `startRevision` = the last event's revision). Not retried automatically.
   */
  async *watchClaims(options: WatchClaimsOptions = {}): AsyncGenerator<ClaimEvent, void, undefined> {
    const stub = this.ctx.transport.stubs.claims;
    const call = (stub.WatchClaims as (r: unknown, md: grpc.Metadata, o: grpc.CallOptions) => grpc.ClientReadableStream<unknown>)
        .call(stub, {filter: filterMessage(options), start_revision: String(options.startRevision ?? 0)},
              this.ctx.transport.metadata(), {});
    for await (const ev of iterateStream(call, options.signal)) yield toClaimEvent(ev);
  }

  /** Checks that the server answers (no token needed). */
  async ping(options: CallOptions = {}): Promise<PingResult> {
    const res = await this.ctx.transport.unary({
      stub: 'diagnostics', method: 'Ping', deadline: deadlineOf(this.ctx, options), signal: options.signal,
      idempotent: true, request: {payload: Buffer.alloc(0)},
    });
    const t = res.server_time;
    return {
      serverVersion: res.server_version, serverCommit: res.server_commit,
      serverTime: t ? new Date(Number(t.seconds) * 1000 + Math.floor(t.nanos / 1e6)) : null,
    };
  }

  /** Closes the connection; calls in flight fail with Cancelled or Unavailable. */
  close(): void {
    this.ctx.transport.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
