// Types of @idempotency/pg.

/** What a pg.Pool offers that the library uses. */
export interface Queryable {
  query(text: string): Promise<any>;
}
export interface PoolClient extends Queryable {
  release(err?: Error | boolean): void;
}
export interface Pool extends Queryable {
  connect(): Promise<PoolClient>;
}

/** A duration: milliseconds, or PostgreSQL interval text ('30 seconds'). */
export type Duration = number | string;

export type HeaderPairs = Array<[string, string]>;

export interface ClaimOptions {
  operation?: string;
  tenant?: string;
  caller?: string;
  ttl?: Duration;
  lease?: Duration;
  wait?: Duration;
  onLeaseExpiry?: 'unknown' | 'retry';
  onExpired?: 'reject' | 'proceed';
}

export interface Call extends ClaimOptions {
  operation: string;
  /** The Idempotency-Key as received; undefined or null answers 400. */
  key: string | undefined | null;
  /** The request the fingerprint covers: any JSON value, or JSON text with rawRequest. */
  request?: unknown;
  rawRequest?: boolean;
}

export type Outcome = 'proceed' | 'replay' | 'in_progress' | 'mismatch' | 'unknown' | 'expired' | 'rate_limited';

/** The answer to send. */
export interface Response {
  status: number;
  headers: HeaderPairs;
  body: Buffer;
  /** The claim's outcome; null when the key was refused before the claim (400). */
  outcome: Outcome | null;
  /** True for a replay: headers end with Idempotent-Replayed: true. */
  replayed: boolean;
}

/** What a handler returns. A body that is not a Buffer, Uint8Array or string is sent as JSON. */
export interface HandlerResult {
  status?: number;
  headers?: Record<string, string> | HeaderPairs;
  body?: unknown;
  resourceId?: string | number;
  /** Store it with idem_fail: replayed like a success. */
  failed?: boolean;
  /** Store it with idem_fail(retryable => true): a retry runs again. */
  retryable?: boolean;
}

export interface AttemptContext {
  key: string;
  token: string;
  attempt: number;
  recoveryPoint: string | null;
}

export interface ExternalContext extends AttemptContext {
  /** Aborted when the attempt lost its lease. */
  signal: AbortSignal;
  checkpoint(point: string): Promise<void>;
  deriveKey(step: string): Promise<string>;
}

export interface IdempotencyOptions extends ClaimOptions {
  /** The extension's schema, when it is not on the search_path. */
  schema?: string;
  /**
   * Prepare the claim and the completions once per connection (default true);
   * turned off for good at the first sign of a pooler that moves the client
   * between server connections (pgbouncer in transaction mode). false: never.
   */
  preparedStatements?: boolean;
}

export class Idempotency {
  constructor(pool: Pool, options?: IdempotencyOptions);
  /** Whether run() prepares its statements: false once a pooler was seen, or when set so. */
  preparedStatements: boolean;
  run(call: Call, handler: (client: PoolClient, ctx: AttemptContext) => Promise<HandlerResult> | HandlerResult): Promise<Response>;
  runExternal(call: Call & { lease?: number }, handler: (ctx: ExternalContext) => Promise<HandlerResult> | HandlerResult): Promise<Response>;
  claimSql(call: Call): string;
}

export class HttpError extends Error {
  constructor(status: number, errorCode: string, message: string);
  status: number;
  errorCode: string;
  toResponse(): { status: number; headers: HeaderPairs; body: Buffer };
}

export class RetryableError extends Error {
  constructor(message: string, options?: { status?: number; retryAfter?: number });
  status: number;
  retryAfter: number;
}

export class LeaseLostError extends Error {
  cause: Error;
}

/** The answer to a row of idem_claim whose outcome is not proceed. */
export function answer(decision: Record<string, unknown>): Response;
/** A string as an SQL literal (PQescapeLiteral's quoting). */
export function literal(value: string): string;
