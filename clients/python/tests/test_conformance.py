"""clients/conformance.json, the answers every library gives the same: each
decision row's HTTP answer, each SQLSTATE's kind, each header pair a
handler may return.  (Its hostile rows run end to end against every
adapter: examples/python/test_payments_service.py.)  No database needed."""

import json
import os
import types

import pytest

from idempotency_pg import core
from idempotency_pg._adapter import MAX_NESTING, too_deep

with open(os.path.join(os.path.dirname(__file__), "..", "..", "conformance.json"), encoding="utf-8") as f:
    FIXTURE = json.load(f)


def unhex(h):
    return None if h is None else bytes.fromhex(h)


@pytest.mark.parametrize("row", FIXTURE["decisions"]["rows"], ids=lambda r: r["name"])
def test_decision(row):
    d = dict(row["row"], body=row["row"].get("body_text"), raw_body=unhex(row["row"]["raw_body_hex"]))
    r = core.answer(d)
    assert r.status == row["status"]
    assert [list(h) for h in r.headers] == row["headers"]
    assert r.body == (unhex(row["body_hex"]) if "body_hex" in row else row["body_text"].encode())


class Refused(Exception):
    def __init__(self, state):
        super().__init__("refused")
        self.sqlstate = state
        self.diag = types.SimpleNamespace(message_primary="refused")


KINDS = {"IDEMPOTENCY_KEY_INVALID": "key_invalid", "INVALID_REQUEST": "request_invalid"}


@pytest.mark.parametrize("state,kind", sorted(FIXTURE["sqlstates"]["codes"].items()))
def test_sqlstate(state, kind):
    err = Refused(state)
    try:
        r = core.refuse(err)
        got = KINDS.get(json.loads(r.body)["error_code"]) if r.status == 400 else r.status
    except Refused as e:
        assert e is err
        got = "error"
    assert got == kind


@pytest.mark.parametrize("row", FIXTURE["header_values"]["rows"], ids=lambda r: repr([r["name"], r["value"]]))
def test_header_value(row):
    pair = (row["name"], row["value"])
    if row["valid"]:
        assert core.Result(200, [pair]).headers == [pair]
    else:
        with pytest.raises(ValueError):
            core.Result(200, [pair])


def test_nesting_limit():
    assert MAX_NESTING == FIXTURE["nesting_limit"]

    def at(n):
        return "[" * n + '"[{\\"["' + "]" * n

    assert not too_deep(at(MAX_NESTING))
    assert too_deep(at(MAX_NESTING + 1))
