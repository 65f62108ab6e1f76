"""What the framework adapters share: the body as JSON, and the call."""

import json

from .core import HttpError

MAX_BODY = 1 << 20


# How deep a body may nest arrays and objects (the outer one counts): the
# same limit in every library (clients/conformance.json), checked before the
# parser runs, whose recursion would end in RecursionError (a 500).
MAX_NESTING = 512


def too_deep(text, limit=MAX_NESTING):
    """Whether JSON text nests arrays and objects deeper than limit
    (brackets inside strings are not counted)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, in_string, escaped = 0, False, False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def parse(raw, max_body=MAX_BODY):
    """(text, value) of a JSON body; an empty body is None.  Too large: 413;
    nested deeper than MAX_NESTING: 400 JSON_TOO_DEEP; not UTF-8 JSON: 400
    INVALID_JSON."""
    if len(raw) > max_body:
        raise HttpError(413, "BODY_TOO_LARGE", "the body is too large")
    try:
        text = raw.decode("utf-8")
    except ValueError:
        raise HttpError(400, "INVALID_JSON", "the body is not valid JSON") from None
    if too_deep(text):
        raise HttpError(400, "JSON_TOO_DEEP", "the body nests arrays and objects more than %d deep" % MAX_NESTING)
    try:
        return text, (json.loads(text) if text else None)
    except ValueError:
        raise HttpError(400, "INVALID_JSON", "the body is not valid JSON") from None


def key_of(values):
    """The Idempotency-Key of a request from its header lines' values (None:
    missing).  The header holds one key: two lines, or a comma in the value
    (HTTP lets a proxy join two lines so; WSGI servers do), are the client's
    bad key, 400."""
    if not values:
        return None
    if len(values) > 1 or "," in values[0]:
        raise HttpError(400, "IDEMPOTENCY_KEY_INVALID", "send one Idempotency-Key header, holding one key (no comma)")
    return values[0]


def call_arguments(options, req, key, text, body):
    """The keyword arguments of run() for a request.  options: operation,
    the claim's options, validate_request(req, body) (checks before the
    claim: an HttpError it raises is answered, nothing is stored),
    request(req, body) (what the fingerprint covers; default the body as
    sent), tenant (a value, or a function of req)."""
    opts = dict(options)
    validate = opts.pop("validate_request", None)
    request = opts.pop("request", None)
    tenant = opts.pop("tenant", None)
    opts.pop("external", None)
    if validate is not None:
        validate(req, body)
    if callable(tenant):
        tenant = tenant(req)
    if tenant is not None:
        opts["tenant"] = tenant
    if request is not None:
        opts["request"] = request(req, body)
    else:
        opts["request"] = text or None
        opts["raw_request"] = True
    opts["key"] = key
    return opts
