import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Idempotency, Response } from './index';
import type { AdapterOptions, Handler } from './lib/adapter';

export interface HttpOptions extends AdapterOptions<IncomingMessage> {
  /** Called with an error that answered 500. */
  onError?: (err: unknown, req: IncomingMessage) => void;
}

export function idempotent(idem: Idempotency, options: HttpOptions, handler: Handler<IncomingMessage>):
  (req: IncomingMessage, res: ServerResponse) => Promise<Response>;

export function send(res: ServerResponse, response: { status: number; headers: Array<[string, string]>; body: Buffer }): void;
