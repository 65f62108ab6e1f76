import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Idempotency } from './index';
import type { AdapterOptions, Handler } from './lib/adapter';

/** Express's request, as far as the adapter uses it. */
export interface ExpressRequest extends IncomingMessage {
  body?: unknown;
  /** The body's bytes, kept by a body parser that ran before the route (express.json({ verify })). */
  rawBody?: Buffer | string;
}

export function idempotent(idem: Idempotency, options: AdapterOptions<ExpressRequest>, handler: Handler<ExpressRequest>):
  (req: ExpressRequest, res: ServerResponse, next: (err?: unknown) => void) => void;
