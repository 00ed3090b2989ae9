"""Points 2 and 3: bodies built to cost the most memory and CPU per byte.

Memory: the processor's peak resident memory stays within the memory model
(ext_proc/core/memory.py) and below the Kubernetes manifest's limit, whatever the bodies.
CPU: while attackers send such bodies in a loop, legitimate requests keep being
answered (no 504 from Envoy's message timeout); their latency is printed, not judged.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from ext_proc.core import memory
from ext_proc.core.config import Config
from tests.hostile.conftest import shipped_stack
from tests.hostile.load import MiB, Timed, attackers, legitimate_chat, post, timed_requests

SIZE = 16 * MiB - 4096  # within the default body limit and Envoy's buffer
DEFAULTS = Config.load(listen="127.0.0.1:0")
MANIFEST = Path(__file__).resolve().parents[2] / "deploy/kubernetes/deployment.yaml"


def padded(prefix: bytes) -> bytes:
    """``prefix`` (an open object with one member) closed with a long string member."""
    return prefix + b',"pad":"' + b"y" * (SIZE - len(prefix) - 10) + b'"}'


# Each attacker body names kv_transfer_params (null: nothing to strip), so it is parsed;
# a body without the key is forwarded unparsed and costs the processor nothing per value.
KV = b'"kv_transfer_params":null,'
# 11 million values: refused from its bytes (413 body_too_complex).
EMPTY_LISTS = b"{" + KV + b'"a":[' + b"[]," * (SIZE // 3 - 12) + b"[]]}"
# The costliest admissible body: as many empty lists as max_json_values allows.
MOST_VALUES = padded(b"{" + KV + b'"a":[' + b"[]," * (DEFAULTS.max_json_values // 2 - 8) + b"[]]")
# One astral character: CPython stores the whole string in UCS-4.
ASTRAL = b"{" + KV + b'"a":"\xf0\x9f\x98\x80' + b"a" * (SIZE - 12 - len(KV)) + b'"}'
# json.loads territory: orjson refuses NaN; 4 million floats.
NAN_FLOATS = b"{" + KV + b'"a":[' + b"0.5," * (SIZE // 4 - 16) + b'1],"n":NaN}'
# What a long prompt looks like, for comparison.
PROSE = padded(b'{"model":"tiny","messages":[{"role":"user","content":"Read this."}]')


def kubernetes_limit() -> int:
    (deployment,) = [
        d for d in yaml.safe_load_all(MANIFEST.read_text()) if d["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return int(container["resources"]["limits"]["memory"].removesuffix("Mi")) * MiB


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with shipped_stack(tmp_path_factory.mktemp("one-message"), "one-message") as stack:
        yield stack


def test_costliest_bodies_keep_the_processor_within_its_memory_model(gateway):
    url = gateway.url + "/v1/chat/completions"
    before = gateway.processor_memory_kib()["VmRSS"] << 10
    gateway.reset_processor_peak()
    senders = 12
    bodies = [EMPTY_LISTS, MOST_VALUES, ASTRAL, NAN_FLOATS] * senders
    with ThreadPoolExecutor(max_workers=senders) as pool:
        replies = list(pool.map(lambda data: post(url, data)[0], bodies))
    peak = gateway.processor_memory_kib()["VmHWM"] << 10
    statuses = {name: replies[i::4] for i, name in enumerate(("lists", "most", "astral", "nan"))}
    # At most one message per stream queued in gRPC (ext_proc/core/memory.py).
    bound = memory.resident_bound(before, DEFAULTS.inflight_budget_bytes, SIZE, senders)
    print(
        f"\n{len(bodies)} bodies of 16 MiB, {senders} at a time: statuses "
        f"{ {s: replies.count(s) for s in sorted(set(replies))} }; processor RSS before "
        f"{before / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB (model bound {bound / MiB:.0f} MiB, "
        f"Kubernetes limit {kubernetes_limit() / MiB:.0f} MiB)"
    )
    assert set(replies) <= {200, 413, 503}, statuses
    assert replies[0::4] == [413] * senders  # too many values, refused from the bytes
    assert replies[3::4] == [413] * senders  # too many values for json.loads
    assert 200 in replies[1::4] + replies[2::4]  # the costliest admissible bodies pass
    assert peak < bound
    assert peak < kubernetes_limit()


def test_costly_bodies_do_not_stall_other_requests(gateway):
    url = gateway.url + "/v1/chat/completions"

    def attack(stop: threading.Event) -> None:
        while not stop.is_set():
            for data in (NAN_FLOATS, MOST_VALUES, EMPTY_LISTS):
                post(url, data)

    def plain(stop: threading.Event) -> None:  # the same bytes as long prompts
        while not stop.is_set():
            post(url, PROSE)

    legit, reference = Timed(), Timed()
    for attack_with, timed in ((attack, legit), (plain, reference)):
        halt = attackers(6, attack_with)
        try:
            timed_requests(url, legitimate_chat(), 10, timed)
        finally:
            halt()
    print(
        f"\n2 KiB requests while 6 clients send 16 MiB costly bodies: {legit.summary()}"
        f"\n... while 6 clients send 16 MiB plain prompts instead: {reference.summary()}"
    )
    assert legit.statuses
    assert set(legit.statuses) == {200}, legit.summary()
