import type { ClaimOptions, AttemptContext, ExternalContext, HandlerResult, PoolClient, Response } from '../index';

export interface AdapterOptions<Req> extends Omit<ClaimOptions, 'tenant'> {
  operation: string;
  /** The three-transaction form: the claim commits with a lease, the handler gets no client. */
  external?: boolean;
  /** Checks before the claim: an HttpError it throws is answered, and nothing is stored. */
  validateRequest?: (req: Req, body: unknown) => void | Promise<void>;
  /** What the fingerprint covers; default the parsed body. */
  request?: (req: Req, body: unknown) => unknown;
  tenant?: string | ((req: Req) => string);
  /** Largest body read, in bytes (node:http and Express without a body parser); default 1 MiB. */
  maxBody?: number;
}

export type RequestContext<Req> = AttemptContext & { req: Req; body: unknown };
export type ExternalRequestContext<Req> = ExternalContext & { req: Req; body: unknown };

export type Handler<Req> =
  | ((client: PoolClient, ctx: RequestContext<Req>) => Promise<HandlerResult> | HandlerResult)
  | ((ctx: ExternalRequestContext<Req>) => Promise<HandlerResult> | HandlerResult);

export type { Response };
