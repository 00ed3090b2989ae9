"""Requests, answers and streams as the core tests build and read them."""

import json

from ext_proc.core import proof
from ext_proc.core.events import (
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    Reject,
    RequestBody,
    RequestHeaders,
    RouteMetadata,
    StreamedBody,
)
from ext_proc.core.proof import Trust
from tests.driver import Driven

JSON = (("content-type", b"application/json"), ("x-request-id", b"r1"))

AGGREGATED = RouteMetadata({"topology": "aggregated", "action": "strip"}, 2.0)

# Id validation on a route that trusts any caller (proofs: test_inspection, test_mint).
DISAGGREGATED = RouteMetadata(
    {"topology": "disaggregated", "vocab_size": "50", "trust_any_caller": True}, 3.0
)

IDS = json.dumps({"messages": [], "kv_transfer_params": {"prompt_token_ids": [1, 2], "k": 1}})

BUFFERED = BodyMode.BUFFERED

DUPLEX = BodyMode.FULL_DUPLEX_STREAMED

# The path every test request is for (the upstream path: test routes rewrite nothing).
CHAT_PATH = "/v1/chat/completions"


def headers(
    route=AGGREGATED, *, eos=False, mode=BUFFERED, extra=JSON, path=CHAT_PATH, response=None
):
    """Request headers; ``response``: the response body mode Envoy declares (None: none)."""
    return RequestHeaders(extra, eos, mode, route, path=path, response_body_mode=response)


def new(limit=1 << 20, budget=None, values=262_144):
    return Driven(max_body_bytes=limit, max_json_values=values, budget=budget)


def only(actions):
    (action,) = actions
    return action


def error_body(actions):
    action = only(actions)
    assert isinstance(action, Reject)
    payload = json.loads(action.body)
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["code"] == action.status
    assert action.details.startswith("token_policy_")
    return payload["error"]


def streamed(actions):
    """The headers answer followed by the streamed body; returns the joined body."""
    assert actions[0] == ContinueHeaders()
    pieces = actions[1:]
    assert pieces
    assert all(isinstance(p, StreamedBody) for p in pieces)
    assert [p.end_of_stream for p in pieces] == [False] * (len(pieces) - 1) + [True]
    return b"".join(p.chunk for p in pieces)


def deep(depth):
    """A body ``depth`` levels deep with parameters to strip (the outer object: level 1)."""
    inner = '{"a":' * (depth - 1) + "1" + "}" * (depth - 1)
    return f'{{"kv_transfer_params":{{"prompt_token_ids":[1]}},"x":{inner}}}'.encode()


MALFORMED = IDS.replace("[1, 2]", "[1, true]").encode()

MINT_ROUTE = RouteMetadata({"topology": "disaggregated", "action": "mint"}, 2.0)

KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")

PREFILL = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
).encode()

OK_JSON = ((":status", b"200"), ("content-type", b"application/json"))


def prefill_stream(limit=1 << 20, **options):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=limit, trust=trust, **options)
    stream.handle(headers(MINT_ROUTE))
    assert stream.handle(RequestBody(PREFILL, True)) == [ContinueBody(None)]
    return stream


REWRITTEN_MINT = RouteMetadata(
    {
        "topology": "disaggregated",
        "action": "mint",
        "match_prefix": "/pd/prefill/v1/",
        "prefix_rewrite": "/v1/",
    },
    4.0,
)
