import type { Idempotency } from './index';
import type { AdapterOptions, Handler } from './lib/adapter';

/** Fastify's request and reply, as far as the adapter uses them. */
export interface FastifyRequestLike {
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
}
export interface FastifyReplyLike {
  code(status: number): this;
  headers(values: Record<string, string | string[]>): this;
  send(payload: Buffer): this;
}

export function idempotent(idem: Idempotency, options: AdapterOptions<FastifyRequestLike>, handler: Handler<FastifyRequestLike>):
  (request: FastifyRequestLike, reply: FastifyReplyLike) => Promise<FastifyReplyLike>;

/** A Fastify instance (a scope), as far as rawBodies uses it. */
export interface FastifyScopeLike {
  removeAllContentTypeParsers(): void;
  addContentTypeParser(type: string, options: { parseAs: 'buffer' },
    parser: (request: unknown, body: Buffer, done: (err: Error | null, body?: Buffer) => void) => void): void;
}

/** Every body of the scope's routes as its bytes, for the idempotent routes registered there. */
export function rawBodies(scope: FastifyScopeLike): void;
