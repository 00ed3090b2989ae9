"""Point 1: streams that announce large bodies and never send them hold nothing.

One HTTP/2 connection opens 16 streams announcing 16 MiB each (the processor's default
body limit; 256 MiB in all, its default in-flight budget) and sends no body bytes.
Legitimate requests on the same gateway must still be answered.
"""

from __future__ import annotations

import json
import time

from tests.hostile.h2client import H2
from tests.hostile.load import MiB, legitimate_chat, post

ANNOUNCED = 16 * MiB
STREAMS = 16


def test_announced_bodies_never_sent_do_not_starve_others(shipped):
    attacker = H2(shipped.gateway)
    try:
        for _ in range(STREAMS):
            attacker.open("/v1/chat/completions", [("content-length", str(ANNOUNCED))])
        time.sleep(0.5)  # the headers reached the processor, where they are sent
        held = shipped.inflight()
        long_prompt = json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "x" * (3 * MiB // 2)}]}
        ).encode()
        started = time.perf_counter()
        small = post(shipped.url + "/v1/chat/completions", legitimate_chat())
        between = time.perf_counter()
        large = post(shipped.url + "/v1/chat/completions", long_prompt)
        ended = time.perf_counter()
    finally:
        attacker.close()
    print(
        f"\n{STREAMS} x {ANNOUNCED // MiB} MiB announced: budget in use {held:.0f} bytes; "
        f"2 KiB request {small[0]} in {(between - started) * 1000:.0f} ms, "
        f"1.5 MiB request {large[0]} in {(ended - between) * 1000:.0f} ms"
    )
    assert held == 0
    assert small[0] == 200, small
    assert large[0] == 200, large[1][:200]
