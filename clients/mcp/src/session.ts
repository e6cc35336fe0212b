// One MCP session's sandboxes. A session may use only the claims it made itself, and
// ends by releasing all of them (transport closed, HTTP DELETE, idle timeout, shutdown).
//
// Thread-safety: none needed (one event loop); every method may interleave with others at
// its awaits, which is why claims in flight are tracked and settled by close().
import {randomUUID} from 'node:crypto';

import type {ClaimOptions, Client, Sandbox} from '@sbx/client';

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
    if (this.owned.size + this.inFlight.size >= this.maxSandboxes) {
      throw new ToolError('RESOURCE_EXHAUSTED',
                          `this session already holds ${this.maxSandboxes} sandboxes (the most it may): ` +
                          'release one with release_sandbox first');
    }
    // The id says which sbx-mcp session made it, for an operator reading `sbx claims`.
    const id = `mcp-${this.id.slice(0, 8)}-${randomUUID()}`;
    const op = this.claimOwned(pool, {...options, id});
    this.inFlight.add(op);
    try {
      return await op;
    } finally {
      this.inFlight.delete(op);
    }
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
