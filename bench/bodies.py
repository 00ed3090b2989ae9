"""The request bodies of the matrix: size x decision, built deterministically.

Sizes are exact byte counts (2 KiB, 64 KiB, 1 MiB), reached by the length of the last
user message: realistic prompt text (prose, code, quotes, backslashes, tabs, newlines,
non-ASCII letters, an emoji), so that at 1 MiB ``allow`` is a long prompt, the traffic
that dominates an inference gateway. Ids are carried at each size as a decode request
would (at 1 MiB the routes' max_ids, 128k):

- ``allow``: a chat (system, user, assistant, user) without ids on the aggregated route
  ``/v1/``.
- ``strip``: the ids on ``/v1/``; the service removes them and rewrites the body.
- ``deny``: the ids with a ``true`` in the middle on ``/pd-any/v1/``, a route that
  honors any caller's ids once validated (``trust_any_caller``); the service answers 400.
- ``honor``: the valid ids with a proof on ``/pd-any/v1/``: validated and forwarded
  unchanged, the proof unchecked (the caller is trusted: what a route reachable only by
  trusted components does).
- ``honor-proven``: the same bytes on the shipped decode route ``/pd/v1/``, the proof
  the gateway mints on the prefill leg (bench/proofs.py): the proof verified (MAC over
  the parameters, the prompt digest), spent in the record of spent proofs, the ids
  validated, the body forwarded unchanged (its proof included).
- ``strict``: the ``allow`` bytes on ``/strict/v1/``, a copy of the aggregated route
  whose policy names an engine (``strict_body``): the body is parsed whatever it holds
  (no byte scan lets it through unparsed) and its members are checked against what the
  engine declares for the endpoint; all are declared, so it is forwarded unchanged.

A proof is honored once, so ``data`` of both holds a placeholder proof (``proof_at``)
and every request carries another (bench/load.py): the two cells' clients do the same
work and send the same bytes.

The direct and naive arrangements do not look at bodies: every body reaches the upstream.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from bench import proofs

SIZES = {"2k": 2 * 1024, "64k": 64 * 1024, "1m": 1024 * 1024}
DECISIONS = ("allow", "strip", "deny", "honor", "honor-proven", "strict")
AGGREGATED = "/v1/chat/completions"
DISAGGREGATED = "/pd/v1/chat/completions"
ANY_CALLER_ROUTE = "/pd-any/v1/"  # bench/stack.py adds the route
ANY_CALLER = ANY_CALLER_ROUTE + "chat/completions"
STRICT_ROUTE = "/strict/v1/"  # bench/stack.py adds the route
STRICT = STRICT_ROUTE + "chat/completions"
# The engine and release whose request models a strict route forwards (docs/trust.md).
STRICT_ENGINE = "vllm 0.32.0"
# Ids carried at each size: a decode request at 1 MiB carries the route's max_ids.
ID_COUNTS = {"2k": 200, "64k": 8000, "1m": 131072}
VOCAB = 128256
SEED = 6
# Why the service decides as each body intends (ext_proc/core/policy.py's reasons).
REASONS = {
    "allow": "no_transfer_params",
    "strip": "stripped_by_policy",
    "deny": "ids_malformed",
    "honor": "trusted_any_caller",
    "honor-proven": "trusted_proof",
    "strict": "no_transfer_params",
}


@dataclass(frozen=True)
class Body:
    size: str
    decision: str
    path: str
    data: bytes
    id_count: int
    # Where the proof of a proven body starts in ``data`` (proofs.WIDTH bytes): its
    # requests carry another proof there each (bench/proofs.py, bench/load.py).
    proof_at: int | None = None

    @property
    def prefix(self) -> bytes:
        """The bytes before the proof (a proven body)."""
        if self.proof_at is None:
            raise ValueError(f"{self.decision} bodies carry no proof")
        return self.data[: self.proof_at]

    @property
    def suffix(self) -> bytes:
        """The bytes after the proof (a proven body)."""
        if self.proof_at is None:
            raise ValueError(f"{self.decision} bodies carry no proof")
        return self.data[self.proof_at + proofs.WIDTH :]

    def with_proof(self, token: bytes) -> bytes:
        """The body carrying ``token`` instead of its placeholder proof."""
        if len(token) != proofs.WIDTH:
            raise ValueError(f"a proof is {proofs.WIDTH} bytes, not {len(token)}")
        return self.prefix + token + self.suffix

    def expected_status(self, polices: bool) -> int:
        """What the client should see: the service denies, everything else forwards."""
        return 400 if polices and self.decision == "deny" else 200

    @property
    def expected_reason(self) -> str:
        """The reason of the service's decision (its metrics), proof of what it did."""
        return REASONS[self.decision]


# What a long prompt is made of (RAG context, code, chat): repeated to the size needed.
PROMPT_TEXT = (
    'Context, section 4.2 ("Retries"): a client retries with exponential back-off; '
    "the gateway answers 503 with retry-after when it sheds load.\n"
    "```python\ndef backoff(attempt: int) -> float:\n\treturn min(30.0, 0.5 * 2 ** attempt)"
    "  # C:\\temp\\retries.log\n```\n"
    "Résumé des étapes, naïve façade; Straße; 東京の天気は晴れ; Ελληνικά; 🙂 fin.\n"
)


def _prompt(size: int) -> str:
    """Prompt text whose JSON encoding (without quotes) is exactly ``size`` bytes."""
    text = PROMPT_TEXT * (size // len(_encode(PROMPT_TEXT)) + 1)
    low, high = 0, len(text)  # the longest prefix that encodes within size
    while low < high:
        mid = (low + high + 1) // 2
        if len(_encode(text[:mid])) - 2 <= size:
            low = mid
        else:
            high = mid - 1
    prefix = text[:low]
    return prefix + "x" * (size - (len(_encode(prefix)) - 2))


def _document(ids: list[Any] | None, pad: int, proven: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Cite the context."},
            {"role": "user", "content": "Why does the client back off?"},
            {"role": "assistant", "content": "So that a shedding gateway can recover."},
            {"role": "user", "content": _prompt(pad)},
        ],
        "max_tokens": 16,
    }
    if ids is not None:
        doc["kv_transfer_params"] = {
            "prompt_token_ids": ids,
            "do_remote_prefill": False,
            "remote_engine_id": "prefill-0",
        }
        if proven:
            # Signed for this very document: the length of a proof does not depend on
            # what it signs, so the padding computed before signing stays exact.
            doc["kv_transfer_params"]["token_policy_proof"] = proofs.sign(doc)
    return doc


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _exact(ids: list[Any] | None, size: int, proven: bool = False) -> bytes:
    """The document padded so that its encoding is exactly ``size`` bytes."""
    bare = len(_encode(_document(ids, 0, proven)))
    if bare > size:
        raise ValueError(f"{len(ids or [])} ids do not fit in {size} bytes")
    data = _encode(_document(ids, size - bare, proven))
    assert len(data) == size
    return data


def build(size: str, decision: str) -> Body:
    if size not in SIZES or decision not in DECISIONS:
        raise ValueError(f"unknown cell {size}/{decision}")
    rng = random.Random(f"{SEED}-{size}")  # noqa: S311 - reproducible data, not secrets
    count = ID_COUNTS[size]
    ids: list[Any] = [rng.randrange(VOCAB) for _ in range(count)]
    if decision in ("allow", "strict"):
        # The same bytes on either route: the cells differ only in the route's strict_body.
        path = AGGREGATED if decision == "allow" else STRICT
        return Body(size, decision, path, _exact(None, SIZES[size]), 0)
    if decision == "strip":
        return Body(size, decision, AGGREGATED, _exact(ids, SIZES[size]), count)
    if decision in ("honor", "honor-proven"):
        # The same bytes on either route, a proof spliced into each request: the cells
        # differ only in the route, which verifies the proof (/pd/v1/) or trusts the
        # caller and leaves it unchecked (/pd-any/v1/).
        data = _exact(ids, SIZES[size], True)
        token = json.loads(data)["kv_transfer_params"]["token_policy_proof"].encode()
        if len(token) != proofs.WIDTH or data.count(token) != 1:
            raise ValueError("the placeholder proof is not where a proof can be spliced")
        path = ANY_CALLER if decision == "honor" else DISAGGREGATED
        return Body(size, decision, path, data, count, data.index(token))
    ids[count // 2] = True
    return Body(size, decision, ANY_CALLER, _exact(ids, SIZES[size]), count)
