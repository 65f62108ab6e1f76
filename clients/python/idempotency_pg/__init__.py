"""idempotency_pg: the Idempotency-Key pattern on the idempotency PostgreSQL
extension, over psycopg 3 or psycopg2, with ASGI (Starlette, FastAPI) and
WSGI (Flask) adapters."""

from .core import (HttpError, Idempotency, LeaseLostError, Pool, Response, Result, RetryableError,
                   answer)

__version__ = "1.1.0"
__all__ = ["Idempotency", "AsyncIdempotency", "HttpError", "RetryableError", "LeaseLostError", "Pool",
           "Response", "Result", "answer"]


def __getattr__(name):
    if name == "AsyncIdempotency":  # psycopg 3's async API, loaded when asked for
        from .aio import AsyncIdempotency
        return AsyncIdempotency
    raise AttributeError(name)
