// One MCP session's sandboxes. A session may use only the claims it made itself, and
// ends by releasing all of them (transport closed, HTTP DELETE, idle timeout, shutdown).
//
// Thread-safety: none needed (one event loop); every method may interleave with others at
// its awaits, which is why claims in flight are tracked and settled by close().
import {randomUUID} from 'node:crypto';

import type {ClaimOptions, Client, ForkOptions, Sandbox, Snapshot} from '@sbx/client';

/** A tool error whose message is shown to the agent as it is. */
export class ToolError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

/** What the session knows of one of its sandboxes. */
export interface OwnedSandbox {
  sandbox: Sandbox;
  pool: string;
  claimedAt: Date;
  expiresAt: Date | null;
}

export class SandboxSession {
  /** Claim ids this session made and has not released, in claim order. */
  private readonly owned = new Map<string, OwnedSandbox>();
  /**
   * Snapshots this session made (snapshot_sandbox, or the source of fork_sandbox). Only
   * these can be used by reset_sandbox and fork_sandbox: other sessions of the same sbx
   * tenant (sbx-mcp --http) share its token, and a snapshot holds a sandbox's files.
   * Deleted when the session ends.
   */
  private readonly snapshots = new Map<string, Snapshot>();
  /** Sandboxes being claimed or forked, for the limit. */
  private pendingSlots = 0;
  /** Ids released through release_sandbox, for a clearer error when used again. */
  private readonly released = new Set<string>();
  private readonly inFlight = new Set<Promise<unknown>>();
  private closing: Promise<void> | undefined;

  constructor(readonly id: string, private readonly client: Client, private readonly maxSandboxes: number,
              private readonly log: (line: string) => void) {}

  get closed(): boolean {
    return this.closing !== undefined;
  }

  /** The session's sandboxes. */
  list(): OwnedSandbox[] {
    return [...this.owned.values()];
  }

  /**
   * Claims a sandbox for this session. Throws ToolError when the session holds its
   * maximum or has ended, or the SDK's SbxError.
   */
  async claim(pool: string, options: ClaimOptions): Promise<OwnedSandbox> {
    if (this.closed) throw new ToolError('FAILED_PRECONDITION', 'this MCP session has ended');
    this.reserve(1);
    // The id says which sbx-mcp session made it, for an operator reading `sbx claims`.
    const id = `mcp-${this.id.slice(0, 8)}-${randomUUID()}`;
    const op = this.claimOwned(pool, {...options, id});
    this.inFlight.add(op);
    try {
      return await op;
    } finally {
      this.inFlight.delete(op);
      this.pendingSlots -= 1;
    }
  }

  /** Holds `n` of the session's sandbox slots, or throws ToolError(RESOURCE_EXHAUSTED). */
  private reserve(n: number): void {
    const held = this.owned.size + this.pendingSlots;
    if (held + n > this.maxSandboxes) {
      throw new ToolError('RESOURCE_EXHAUSTED',
                          `this session holds ${held} sandboxes and may hold ${this.maxSandboxes}: ` +
                          `${n} more do not fit; release some with release_sandbox first`);
    }
    this.pendingSlots += n;
  }

  /** The session's snapshots, oldest first. */
  listSnapshots(): Snapshot[] {
    return [...this.snapshots.values()];
  }

  /** Snapshots one of the session's sandboxes; the snapshot becomes the session's. */
  async snapshot(claimId: string, name: string | undefined): Promise<Snapshot> {
    const {sandbox} = this.get(claimId);
    if (this.closed) throw new ToolError('FAILED_PRECONDITION', 'this MCP session has ended');
    const op = (async () => {
      const snap = await sandbox.snapshot({name, labels: {'sbx-mcp-session': this.id.slice(0, 8)}});
      if (this.closed) {
        // close() has deleted the session's snapshots already (or will not see this one).
        await this.client.snapshots.delete(snap).catch(() => {});
        throw new ToolError('FAILED_PRECONDITION', 'this MCP session ended while the snapshot was made');
      }
      this.adoptSnapshot(snap.id, snap);
      return snap;
    })();
    this.inFlight.add(op);
    try {
      return await op;
    } finally {
      this.inFlight.delete(op);
    }
  }

  /**
   * One of this session's snapshots. Throws ToolError(NOT_FOUND) for any other id, as the
   * sbx server does for another tenant's: whether it exists elsewhere is not disclosed.
   */
  getSnapshot(snapshotId: string): Snapshot {
    const snap = this.snapshots.get(snapshotId);
    if (snap) return snap;
    throw new ToolError('NOT_FOUND',
                        `snapshot "${snapshotId}" is not one of this session's snapshots ` +
                        `(this session made: ${[...this.snapshots.keys()].join(', ') || 'none'}); ` +
                        'make one with snapshot_sandbox');
  }

  /** Resets one of the session's sandboxes to one of its snapshots. */
  async reset(claimId: string, snapshotId: string): Promise<void> {
    const {sandbox} = this.get(claimId);
    const snap = this.getSnapshot(snapshotId);
    await sandbox.reset(snap);
  }

  /**
   * `count` forks of one of the session's snapshots or sandboxes (a sandbox is snapshotted
   * first; that snapshot becomes the session's); they become the session's sandboxes.
   */
  async fork(source: {snapshot?: string; sandbox?: string}, count: number, options: ForkOptions):
      Promise<{snapshotId: string; forks: OwnedSandbox[]}> {
    if (this.closed) throw new ToolError('FAILED_PRECONDITION', 'this MCP session has ended');
    const from = source.sandbox !== undefined ? this.get(source.sandbox).sandbox : this.getSnapshot(source.snapshot!);
    this.reserve(count);
    const op = (async () => {
      const group = await this.client.fork(from, count, {...options, id: `mcp-${this.id.slice(0, 8)}-${randomUUID()}`});
      // A sandbox source made a snapshot: the session's, to reset to and to delete at the end.
      this.adoptSnapshot(group.snapshotId);
      const forks = group.sandboxes.map((sandbox) => ({
        sandbox, pool: sandbox.claim?.pool ?? '', claimedAt: new Date(), expiresAt: sandbox.claim?.expiresAt ?? null,
      }));
      if (this.closed) {
        await Promise.all(group.sandboxes.map((s) => this.releaseQuietly(s)));
        throw new ToolError('FAILED_PRECONDITION', 'this MCP session ended while the forks were made');
      }
      for (const f of forks) this.owned.set(f.sandbox.claimId, f);
      return {snapshotId: group.snapshotId, forks};
    })();
    this.inFlight.add(op);
    try {
      return await op;
    } finally {
      this.inFlight.delete(op);
      this.pendingSlots -= count;
    }
  }

  private adoptSnapshot(id: string, snap?: Snapshot): void {
    if (this.snapshots.has(id)) return;
    this.snapshots.set(id, snap ?? {
      id, name: '', labels: {}, owner: '', sourceClaimId: '', parentImageDigest: '', parentSnapshotId: '',
      sizeBytes: 0, createdAt: null, droppedEntries: 0,
    });
  }

  private async claimOwned(pool: string, options: ClaimOptions): Promise<OwnedSandbox> {
    const sandbox = await this.client.claim(pool, options);
    const owned = {sandbox, pool, claimedAt: new Date(), expiresAt: sandbox.claim?.expiresAt ?? null};
    if (this.closed) {
      // The session ended while the claim waited: nobody can use it, give it back
      // (close() waits for this).
      await this.releaseQuietly(sandbox);
      throw new ToolError('FAILED_PRECONDITION', 'this MCP session ended while the claim was made');
    }
    this.owned.set(sandbox.claimId, owned);
    return owned;
  }

  /**
   * One of this session's sandboxes. Throws ToolError(PERMISSION_DENIED) for any other
   * id, whether or not such a claim exists (another session's claims are not visible).
   */
  get(claimId: string): OwnedSandbox {
    const owned = this.owned.get(claimId);
    if (owned) return owned;
    if (this.released.has(claimId)) {
      throw new ToolError('FAILED_PRECONDITION', `sandbox "${claimId}" was released by this session; claim a new one`);
    }
    throw new ToolError('PERMISSION_DENIED',
                        `sandbox "${claimId}" is not one of this session's sandboxes ` +
                        `(this session holds: ${[...this.owned.keys()].join(', ') || 'none'}); ` +
                        'use claim_sandbox, a session may use only the sandboxes it claimed');
  }

  /** Releases one of the session's sandboxes. Throws as {@link get}, or the SDK's SbxError. */
  async release(claimId: string): Promise<string> {
    const owned = this.get(claimId);
    const claim = await owned.sandbox.release();
    this.owned.delete(claimId);
    this.released.add(claimId);
    return claim.state;
  }

  /** Ends the session: releases every sandbox it holds (and claims still in flight). Idempotent. */
  close(reason: string): Promise<void> {
    if (!this.closing) {
      this.closing = (async () => {
        // Claims in flight release themselves when they complete (see claim()).
        await Promise.allSettled([...this.inFlight]);
        const all = [...this.owned.values()];
        this.owned.clear();
        if (all.length) this.log(`session ${this.id} ended (${reason}): releasing ${all.length} sandbox(es)`);
        await Promise.all(all.map((o) => this.releaseQuietly(o.sandbox)));
        // Then its snapshots (a claimed fork would keep one from being deleted).
        const snaps = [...this.snapshots.keys()];
        this.snapshots.clear();
        await Promise.all(snaps.map(async (id) => {
          try {
            await this.client.snapshots.delete(id);
          } catch (e) {
            this.log(`session ${this.id}: deleting snapshot ${id} failed: ${(e as Error).message}`);
          }
        }));
      })();
    }
    return this.closing;
  }

  private async releaseQuietly(sandbox: Sandbox): Promise<void> {
    try {
      await sandbox.release();
    } catch (e) {
      this.log(`session ${this.id}: release of ${sandbox.claimId} failed: ${(e as Error).message}`);
    }
  }
}
