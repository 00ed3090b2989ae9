"""The processor's RPC ends at the decision where nothing is left to process, through the
real Envoy, in each arrangement of the request's messages (docs/body-modes.md).

On the aggregated /v1/ and the decode /pd/v1/ routes nothing of the response is
processed: the RPC ends with the request's last answer while the upstream's streamed
answer is still held open, and the request still arrives upstream exactly as answered
(the same bytes, or the body without the client's parameters) and the client still gets
the whole streamed answer. On the prefill route (mint) the response is processed: its
RPC stays open while the answer is late, and the answer comes back signed.

When an RPC ended is read from the processor's own count of ended streams (its
processing-time histogram, observed as each RPC ends), not from a sampled gauge."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import httpx
import pytest

from devstack import upstream
from tests.e2e.conftest import BODY_MODES, KEY_ID
from tests.e2e.held_upstream import EVENTS, HeldUpstream
from tests.e2e.stack import Stack, new_key
from tests.e2e.test_gateway import JSON, KV, assert_stripped, chat
from tests.e2e.test_handoff import PREFILL, prefill_body


@pytest.fixture(scope="module")
def held() -> Iterator[HeldUpstream]:
    with HeldUpstream().running() as running:
        yield running


@pytest.fixture(scope="module", params=list(BODY_MODES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, held: HeldUpstream
) -> Iterator[Stack]:
    """The shipped config of one arrangement: the aggregated and decode routes reach the
    held upstream, the prefill route the recording stand-in (which answers like vLLM)."""
    assert held.address is not None
    others = {"aggregated": held.address, "disaggregated": held.address}
    workdir = tmp_path_factory.mktemp(request.param)
    with Stack(
        workdir, source=BODY_MODES[request.param], proof_keys={KEY_ID: new_key()}, others=others
    ) as running:
        yield running


def ended(stack: Stack, route: str) -> int:
    """How many of the route's RPCs have ended."""
    with urllib.request.urlopen(f"http://{stack.metrics}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    name = f'ext_proc_processing_seconds_count{{route="{route}"}} '
    return next(
        (int(float(line[len(name) :])) for line in text.splitlines() if line.startswith(name)), 0
    )


def envoy_ext_proc_stats(stack: Stack) -> dict[str, int]:
    """Envoy's counters of the ext_proc filter, by name."""
    url = f"http://{stack.admin}/stats?filter=ext_proc\\.&usedonly"
    with urllib.request.urlopen(url, timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    found = (re.fullmatch(r"http\.gateway\.ext_proc\.(\w+): (\d+)", line) for line in lines)
    return {match[1]: int(match[2]) for match in found if match}


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


ROUTES = {"/v1/chat/completions": "aggregated", "/pd/v1/chat/completions": "disaggregated"}
UNTOUCHED = b'{"model": "tiny",  "messages": [{"role": "user", "content": "hi"}], "n": 1.50}'


@pytest.mark.parametrize("path", list(ROUTES))
@pytest.mark.parametrize("stripped", [False, True], ids=["untouched", "stripped"])
def test_the_rpc_ends_at_the_decision_and_the_answer_streams_whole(stack, held, path, stripped):
    route = ROUTES[path]
    sent = chat({"prompt_token_ids": [1, 2], "k": 0}) if stripped else None
    data = json.dumps(sent).encode() if sent is not None else UNTOUCHED
    held.clear()
    held.hold()
    before = ended(stack, route)
    with (
        httpx.Client(timeout=20) as client,
        client.stream("POST", stack.url + path, content=data, headers=JSON) as reply,
    ):
        assert reply.status_code == 200
        chunks = reply.iter_raw()
        first = next(chunks)
        # The upstream holds the rest of its answer: the RPC has ended all the same.
        ended_early = wait_for(lambda: ended(stack, route) == before + 1)
        held.release()
        received = first + b"".join(chunks)
    assert received == b"".join(EVENTS)
    (arrived,) = held.arrived()
    assert arrived.head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    if sent is None:
        assert arrived.body == data
    else:
        assert_stripped(json.loads(arrived.body), sent)
    if not arrived.chunked:  # its length is the length of the body that arrived
        assert f"content-length: {len(arrived.body)}\r\n".encode() in arrived.head.lower()
    assert ended_early, "the RPC stayed open while the answer streamed"
    stats = envoy_ext_proc_stats(stack)
    for failure in ("streams_failed", "spurious_msgs_received", "failure_mode_allowed"):
        assert stats.get(failure, 0) == 0, stats


def test_the_prefill_route_keeps_its_rpc_for_the_response_and_signs_it(stack):
    stack.clear()
    before = ended(stack, "prefill")
    replies: list[httpx.Response] = []

    def post() -> None:
        with httpx.Client(timeout=20) as client:
            body, late = prefill_body(), {upstream.DELAY_HEADER: "2"}
            replies.append(client.post(stack.url + PREFILL, json=body, headers=late))

    thread = threading.Thread(target=post)
    thread.start()
    assert wait_for(lambda: len(stack.received()) == 1)  # decided and forwarded
    time.sleep(1.0)
    assert ended(stack, "prefill") == before  # waiting for the late response
    thread.join(10)
    (reply,) = replies
    assert reply.status_code == 200, reply.text
    assert reply.json()[KV]["token_policy_proof"].startswith("tp4.")
    # Envoy may send the signed answer on before the processor sees its side of the RPC end
    assert wait_for(lambda: ended(stack, "prefill") == before + 1)
