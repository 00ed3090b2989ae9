"""Outside review of the memo of route-policy reads (``stream.Reads``): one shared memo,
fed random requests that differ in the inputs a memo key might leave out (header
spellings and case, repeated headers, content-length forms, request-id values, peers,
route metadata value types, tenant headers, configs, tenant keys, flags); every answer
must be what the uncached ``stream.read`` gives, the request id aside."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ext_proc.core.events import BodyMode, Peer, RequestHeaders, RouteMetadata
from ext_proc.core.route_policy import IdentityType
from ext_proc.core.stream import Read, Reads, read
from tests.driver import config

CONFIGS = [config(), config(max_body_bytes=4096), config(audit=True)]
KEYS = [b"k" * 32, b"j" * 32, None]
ROUTES = [
    RouteMetadata({"action": "strip"}, 1.0, "r"),
    RouteMetadata({"action": "strip"}, 1.0, "s"),
    RouteMetadata({"action": "deny"}, 1.0, "r"),
    RouteMetadata({"action": "strip", "tenant": "header:x-tenant"}, 2.0, "t"),
    RouteMetadata({"action": "strip", "tenant": "header:x-tenant", "fairness_id": True}, 3.0, "t"),
    RouteMetadata({"action": "strip", "tenant": "peer_san"}, 2.0, "p"),
    RouteMetadata({"action": "strip", "tenant": "route:acme"}, 2.0, "q"),
    RouteMetadata({"action": True}, 1.0, "r"),
    RouteMetadata({"action": 1.0}, 1.0, "r"),
    RouteMetadata({"action": "strip"}, 2.0, "r"),
    RouteMetadata({"action": "strip"}, None, "r"),
    RouteMetadata({}, None, ""),
    RouteMetadata({"action": "honor", "vocab_size": 0.0}, 2.0, "h"),
    RouteMetadata({"action": "honor", "vocab_size": -0.0}, 2.0, "h"),
    RouteMetadata({"action": "honor", "vocab_size": 128256.0}, 2.0, "h"),
    RouteMetadata({"action": "honor", "vocab_size": 128256.5}, 2.0, "h"),
]
PEERS = [
    Peer(),
    Peer(True),
    Peer(True, ((IdentityType.URI, "spiffe://a/b"),)),
    Peer(True, ((IdentityType.URI, "spiffe://a/c"),)),
    Peer(False, ((IdentityType.URI, "spiffe://a/b"),)),
    Peer(True, ((IdentityType.DNS, "spiffe://a/b"),)),
]
PATHS = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/inference/v1/generate", "/x/y"]
HEADERS = [
    ("content-type", b"application/json"),
    ("content-type", b"text/plain"),
    ("content-type", b"application/json; charset=utf-8"),
    ("Content-Type", b"text/plain"),
    ("content-encoding", b"gzip"),
    ("content-encoding", b"identity"),
    ("Content-Encoding", b"gzip"),
    ("content-length", b"10"),
    ("content-length", b"4096"),
    ("content-length", b"4097"),
    ("content-length", b"00004097"),
    ("content-length", b"+10"),
    ("content-length", b" 10"),
    ("content-length", b"9" * 19),
    ("content-length", b"\xd9\xa1"),
    ("Content-Length", b"99999999999"),
    ("x-request-id", b"a"),
    ("x-request-id", b"b\xff"),
    ("X-Request-Id", b"c"),
    ("x-tenant", b"acme"),
    ("x-tenant", b"other"),
    ("x-tenant", b"a,b"),
    ("x-tenant", b" "),
    ("X-Tenant", b"acme"),
    ("traceparent", b"00-aa-bb-01"),
]


def _blank(found: Read) -> Read:
    return dataclasses.replace(found, request=dataclasses.replace(found.request, request_id=""))


def _event(rnd: random.Random) -> RequestHeaders:
    headers = tuple(rnd.choice(HEADERS) for _ in range(rnd.randrange(6)))
    return RequestHeaders(
        headers,
        rnd.random() < 0.2,
        rnd.choice([BodyMode.BUFFERED, BodyMode.NONE]),
        rnd.choice(ROUTES),
        rnd.choice(PEERS),
        rnd.choice(PATHS),
        rnd.choice([None, BodyMode.NONE, BodyMode.BUFFERED]),
    )


@pytest.mark.parametrize("seed", range(8))
def test_the_memo_answers_as_the_uncached_reading(seed: int) -> None:
    rnd = random.Random(seed)
    memo = Reads(size=64)
    for _ in range(600):
        event = _event(rnd)
        cfg, key = rnd.choice(CONFIGS), rnd.choice(KEYS)
        with_body, sent = rnd.random() < 0.7, rnd.random() < 0.7
        found, request_id = memo(event, cfg, key, with_body=with_body, sent=sent)
        reference = read(event, cfg, key, with_body=with_body, sent=sent)
        assert request_id == reference.request.request_id
        assert _blank(found) == _blank(reference), (event, cfg.max_body_bytes, key)
