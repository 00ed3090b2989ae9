"""The memo of what a request's headers say (``stream.Reads``): every input the reading
depends on gives the answer the uncached reading gives, whatever was read before; the
request id never comes from the memo; the memo stays bounded."""

import dataclasses

import pytest

from ext_proc.core import inspection
from ext_proc.core import stream as stream_module
from ext_proc.core.events import BodyMode, Peer, RequestHeaders, RouteMetadata
from ext_proc.core.route_policy import IdentityType
from ext_proc.core.stream import READ_MEMO_BYTES, Reads, read
from tests.core.messages import new
from tests.driver import config

KEY = b"k" * 32
TENANT_ROUTE = RouteMetadata(
    {"action": "strip", "tenant": "header:x-tenant", "fairness_id": True}, 3.0, "tenants"
)
BASE = RequestHeaders(
    (
        ("content-type", b"application/json"),
        ("content-length", b"2048"),
        ("x-tenant", b"acme"),
        ("x-request-id", b"id-1"),
        ("traceparent", b"00-aa-bb-01"),
    ),
    False,
    BodyMode.BUFFERED,
    TENANT_ROUTE,
    path="/v1/chat/completions",
)
CONFIG = config()
LIMIT = str(CONFIG.max_body_bytes).encode()
OVER = str(CONFIG.max_body_bytes + 1).encode()
MTLS = Peer(True, ((IdentityType.URI, "spiffe://a/b"),))


def replaced(name: str, *values: bytes) -> RequestHeaders:
    """BASE with the header ``name``'s values (none: the header removed)."""
    kept = tuple(pair for pair in BASE.headers if pair[0] != name)
    return dataclasses.replace(BASE, headers=kept + tuple((name, value) for value in values))


def with_route(values: dict[str, object], size: float | None, name: str = "r") -> RequestHeaders:
    return dataclasses.replace(BASE, route=RouteMetadata(values, size, name))


INVALID = with_route({"action": "nope"}, 1.0)
# (label, event, config, tenant key, with_body, sent): each differs from the base in one
# input that changes what the headers say.
BASE_CASE = ("base", BASE, CONFIG, KEY, True, True)
CHANGED = [
    ("path", dataclasses.replace(BASE, path="/v1/completions"), CONFIG, KEY, True, True),
    ("token endpoint", dataclasses.replace(BASE, path="/tokenize"), CONFIG, KEY, True, True),
    ("content-type", replaced("content-type", b"text/plain"), CONFIG, KEY, True, True),
    ("no content-type", replaced("content-type"), CONFIG, KEY, True, True),
    ("two content-types", replaced("content-type", b"a/b", b"c/d"), CONFIG, KEY, True, True),
    ("content-encoding", replaced("content-encoding", b"gzip"), CONFIG, KEY, True, True),
    ("content-length over", replaced("content-length", b"99999999999"), CONFIG, KEY, True, True),
    ("content-length 1 over", replaced("content-length", OVER), CONFIG, KEY, True, True),
    ("content-length long", replaced("content-length", b"9" * 40), CONFIG, KEY, True, True),
    ("tenant", replaced("x-tenant", b"other"), CONFIG, KEY, True, True),
    ("no tenant", replaced("x-tenant"), CONFIG, KEY, True, True),
    ("two tenants", replaced("x-tenant", b"a", b"b"), CONFIG, KEY, True, True),
    ("tenant with comma", replaced("x-tenant", b"a,b"), CONFIG, KEY, True, True),
    ("peer", dataclasses.replace(BASE, peer=MTLS), CONFIG, KEY, True, True),
    (
        "response mode",
        dataclasses.replace(BASE, response_body_mode=BodyMode.NONE),
        CONFIG,
        KEY,
        True,
        True,
    ),
    ("route values", with_route({"action": "deny"}, 1.0), CONFIG, KEY, True, True),
    ("route size", with_route({"action": "deny"}, 2.0), CONFIG, KEY, True, True),
    (
        "route name",
        dataclasses.replace(BASE, route=dataclasses.replace(TENANT_ROUTE, name="x")),
        CONFIG,
        KEY,
        True,
        True,
    ),
    ("route typed value", with_route({"audit": True}, 1.0), CONFIG, KEY, True, True),
    ("route value typed otherwise", with_route({"audit": 1.0}, 1.0), CONFIG, KEY, True, True),
    ("global audit", BASE, config(audit=True), KEY, True, True),
    ("invalid route", INVALID, CONFIG, KEY, True, True),
    ("namespace", INVALID, config(route_metadata_namespace="other.ns"), KEY, True, True),
    ("body limit", BASE, config(max_body_bytes=1000), KEY, True, True),
    ("tenant key", BASE, CONFIG, b"j" * 32, True, True),
    ("no tenant key", BASE, CONFIG, None, True, True),
    ("without body", replaced("content-type", b"text/plain"), CONFIG, KEY, False, True),
    ("headers not sent", BASE, CONFIG, KEY, True, False),
]
# The cases that differ in one input from another case rather than from the base.
TWINS = {
    "namespace": "invalid route",
    "without body": "content-type",
    "content-length long": "content-length over",
}
# Inputs that change nothing the headers say.
UNCHANGED = [
    ("request id", replaced("x-request-id", b"id-2"), CONFIG, KEY, True, True),
    # An announced size within the limit refuses nothing, whatever it is.
    ("content-length within", replaced("content-length", b"100"), CONFIG, KEY, True, True),
    ("content-length zeros", replaced("content-length", b"0002048"), CONFIG, KEY, True, True),
    ("content-length at the limit", replaced("content-length", LIMIT), CONFIG, KEY, True, True),
    ("no content-length", replaced("content-length"), CONFIG, KEY, True, True),
    ("content-length not a size", replaced("content-length", b"12a"), CONFIG, KEY, True, True),
    ("content-length sign", replaced("content-length", b"+99999999999"), CONFIG, KEY, True, True),
    (
        "two content-lengths",
        replaced("content-length", b"1", b"99999999999"),
        CONFIG,
        KEY,
        True,
        True,
    ),
    ("trace context", replaced("traceparent", b"00-cc-dd-01"), CONFIG, KEY, True, True),
    ("another header", replaced("user-agent", b"curl"), CONFIG, KEY, True, True),
]


def request_id(event: RequestHeaders) -> str:
    """The x-request-id as the uncached reading keeps it."""
    return inspection.read(event, CONFIG, with_body=False).request_id


def uncached(case):
    """The reading without the memo, its request id blank as a shared one's."""
    _, event, conf, key, with_body, sent = case
    found = read(event, conf, key, with_body=with_body, sent=sent)
    return dataclasses.replace(found, request=dataclasses.replace(found.request, request_id=""))


def memoized(memo, case):
    _, event, conf, key, with_body, sent = case
    return memo(event, conf, key, with_body=with_body, sent=sent)


def test_each_input_changes_the_reading():
    """Each case reads otherwise than the base, or than the case it differs from in
    that one input (the namespace names an invalid field; a media type refused with a
    body passes without one)."""
    twins = {name: case for case in CHANGED if (name := case[0]) in TWINS.values()}
    base = uncached(BASE_CASE)
    for case in CHANGED:
        twin = twins[TWINS[case[0]]] if case[0] in TWINS else BASE_CASE
        assert uncached(case) != uncached(twin), case[0]
    for case in UNCHANGED:
        assert uncached(case) == base, case[0]


@pytest.mark.parametrize("case", CHANGED + UNCHANGED, ids=lambda case: case[0])
def test_the_memo_answers_as_the_reading_does(case):
    memo = Reads()
    for first, second in ((BASE_CASE, case), (case, BASE_CASE)):
        memoized(memo, first)
        for _ in range(2):  # a miss, then a hit
            got, rid = memoized(memo, second)
            assert got == uncached(second)
            assert rid == request_id(second[1])


def test_every_pair_of_cases_is_told_apart():
    memo = Reads()
    cases = [BASE_CASE, *CHANGED, *UNCHANGED]
    for _ in range(2):
        for case in cases:
            assert memoized(memo, case)[0] == uncached(case), case[0]


@pytest.mark.parametrize(
    "ids", [(), (b"a",), (b"a", b"b"), (b"\xff\x00",)], ids=["none", "one", "two", "latin-1"]
)
def test_the_request_id_is_the_requests_own(ids):
    memo = Reads()
    memoized(memo, BASE_CASE)
    event = replaced("x-request-id", *ids)
    read_, rid = memo(event, CONFIG, KEY, with_body=True, sent=True)
    assert rid == request_id(event)
    assert read_.request.request_id == ""  # shared: never one request's


def test_the_memo_is_bounded():
    memo = Reads(size=8)
    for i in range(50):
        memoized(
            memo, ("path", dataclasses.replace(BASE, path=f"/v1/x{i}"), CONFIG, KEY, True, True)
        )
        assert len(memo) <= 8


def test_long_keys_are_not_kept():
    memo = Reads()
    long_path = "/v1/" + "a" * READ_MEMO_BYTES
    long_type = replaced("content-type", b"a" * READ_MEMO_BYTES)
    for event in (dataclasses.replace(BASE, path=long_path), long_type):
        got, _ = memo(event, CONFIG, KEY, with_body=True, sent=True)
        assert got == uncached(("long", event, CONFIG, KEY, True, True))
    assert len(memo) == 0


def test_a_stream_reads_through_the_shared_memo():
    driven = new()
    driven.handle(BASE)
    assert driven.stream._request_id == "id-1"
    assert len(stream_module._READS) > 0


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        (Peer, {"mtls", "identities"}),
        (RouteMetadata, {"values", "size", "name", "items"}),
        (
            RequestHeaders,
            {"headers", "end_of_stream", "body_mode", "route", "peer", "path"}
            | {"response_body_mode"},
        ),
    ],
)
def test_the_key_covers_every_field_the_reading_is_given(kind, fields):
    """The memo's key names these fields one by one (a route by its items, which its
    values are read as; end_of_stream and body_mode are read by the stream's table, not
    by ``read``): a field added must be keyed, or shown to be read by nothing ``read``
    returns, before this list grows."""
    assert {field.name for field in dataclasses.fields(kind)} == fields


def test_sizes_announced_within_the_limit_share_one_entry():
    """Bodies of every size: one entry, not one per size."""
    memo = Reads()
    for size in (1, 2048, 70_000, CONFIG.max_body_bytes):
        event = replaced("content-length", str(size).encode())
        assert memoized(memo, ("size", event, CONFIG, KEY, True, True))[0] == uncached(BASE_CASE)
    assert len(memo) == 1
