"""The core's stream tests again, every request and response body handed over as the
wire reader hands it: a read-only memoryview of its span of the message's bytes (not a
copy, events.Body). Each decision path (allow, strip by rewrite and by splice, deny,
honor, a slow parse by json.loads, a strict body, a tenant's salt, mint and turns
responses, streamed chunks and their repeat) then reads a view as it reads bytes: the
same answers, decisions and charges, which the imported tests assert."""

from __future__ import annotations

import dataclasses
import json
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.core import bytescan, reading, spelling
from ext_proc.core.events import Body, Event, RequestBody, ResponseBody, Step
from ext_proc.core.stream import Stream
from tests.core import test_inspection, test_mint, test_stream, test_tenants, test_turns
from tests.core.messages import AGGREGATED, headers
from tests.driver import Driven

_MODULES: tuple[ModuleType, ...] = (
    test_stream,
    test_inspection,
    test_mint,
    test_tenants,
    test_turns,
)


def as_view(body: bytes) -> memoryview:
    """``body`` as the wire reader hands it: a read-only span of a larger buffer (the
    message), so that an offset or a length taken from the buffer is caught."""
    return memoryview(b"\x0a\x00" + body + b"\x10\x01")[2:-2]


def _viewed(event: Event) -> Event:
    if isinstance(event, RequestBody | ResponseBody) and isinstance(event.chunk, bytes):
        return dataclasses.replace(event, chunk=as_view(event.chunk))
    return event


@pytest.fixture(autouse=True)
def _views(monkeypatch: pytest.MonkeyPatch) -> None:
    handle = Stream.handle

    def viewed(stream: Stream, event: Event) -> Step:
        return handle(stream, _viewed(event))

    monkeypatch.setattr(Stream, "handle", viewed)


# Each module's tests, collected here too under the module's name (the fixture above
# applies to them).
for _module in _MODULES:
    _prefix = _module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and callable(_test):
            globals()[f"test_{_prefix}__{_name.removeprefix('test_')}"] = _test


def test_a_view_is_handed_to_the_core() -> None:
    """The fixture is in force: the body the core reads is a view."""
    seen: list[Body] = []
    judge = reading.parse

    def spy(raw: Body, *args: Any, **kwargs: Any) -> reading.Parsed | None:
        seen.append(raw)
        return judge(raw, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reading, "parse", spy)
        driven = Driven()
        driven.handle(headers(AGGREGATED))
        driven.handle(RequestBody(json.dumps({"kv_transfer_params": {"k": 1}}).encode(), True))
    assert seen
    assert all(type(raw) is memoryview for raw in seen)


def test_the_slow_parse_reads_a_view() -> None:
    """json.loads reads no memoryview: the slow path gives it the view's bytes."""
    raw = b'{"a": 1e400, "b": "\\ud800"}'
    assert reading.parse_slow(as_view(raw)).document == reading.parse_slow(raw).document


# The reference scans (what runs where the compiled parts are not built) read a view as
# they read bytes, whatever the bytes: built from the pieces they look for.
_PIECES = st.sampled_from(
    (
        *(b'"', b"\\", b"\\u00", b"\\u006b", b"{", b"}", b"[", b"]", b",", b":", b" "),
        *(b"\n", b"\xef\xbb\xbf", b"1" * 19, b"7", b"a", b"\xff"),
        *(b'"kv_transfer_params"', b'"prompt_token_ids"'),
    )
)
_BODIES = st.lists(_PIECES, max_size=40).map(b"".join)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=_BODIES, pad=st.integers(0, 1 << 15))
def test_the_scans_read_a_view_as_bytes(
    compiled: bool, raw: bytes, pad: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not compiled:
        monkeypatch.setattr(bytescan, "COMPILED", None)
        monkeypatch.setattr(reading, "_NATIVE", None)
    # Padded with spaces (between the braces' edges and the body's): the vector paths too.
    for body in (raw, raw + b" " * pad, b"{" + b" " * pad + raw + b"}"):
        view = as_view(body)
        names = ("kv_transfer_params", "prompt_token_ids")
        assert spelling.spelled(view, names) == spelling.spelled(body, names)
        quoted = tuple(name.encode() for name in names)
        assert bytescan.quoted(view, quoted, 2) == bytescan.quoted(body, quoted, 2)
        for needle in (b'"', b"\\u00", b"]"):
            assert bytescan.find(view, needle, 1) == body.find(needle, 1)
        assert bytescan.count(view, ord(","), 1) == body.count(b",", 1)
        assert bytescan.has_run(view, ord("1"), 19) == (b"1" * 19 in body)
        assert reading.scan(view, 1000) == reading.scan(body, 1000)
