"""The benchmark's signing key and the proofs its proven bodies carry (docs/trust.md).

Each proof is honored once (the processor records it as spent), so the ``honor-proven``
cells send a different proof with every request: a pool minted for the cell's document
just before the cell runs (``mint_pool``: the same parameters and prompt digest, one
nonce after another, the MAC over the large ids computed once by ``proof.minter``),
spliced into the body by the wrk script (bench/load.py). A proof always has the same
length (``WIDTH``), so the body keeps its exact size.

The key is derived from a constant (a benchmark's key guards nothing); the service
verifies with the same key, read from the file ``processor_config`` writes. The
processor is told a long lifetime (``LIFETIME``): the pool is minted with an expiry an
hour ahead and must stay valid while its cell runs; what a lookup in the record of
spent proofs costs does not depend on how long its entries are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Final

from ext_proc.core import proof, replay
from ext_proc.core.vllm_request import KV_KEY

KEY_ID: Final = "bench"
SECRET: Final = hashlib.sha256(b"ext_proc benchmark proof key").hexdigest().encode()
KEYS: Final = proof.KeySet({KEY_ID: SECRET}, KEY_ID)
# The processor's proof lifetime and the lease it must fit in (ttl + 2 x the default
# 5 s skew <= kv_lease_seconds): the longest ttl the configuration accepts.
LIFETIME: Final = 3600
SKEW: Final = 5
KV_LEASE: Final = LIFETIME + 2 * SKEW
# The expiry of the proof in ``bodies.build``'s fixed bytes (2100-01-01): a placeholder
# of the right length, refused by the service (it outlives the lease); the requests
# carry pool proofs instead.
PLACEHOLDER_EXPIRY: Final = 4_102_444_800
ENDPOINT: Final = "/v1/chat/completions"  # the upstream path of /pd/v1/chat/completions
# tp4.<key id>.<10-digit minting time>.<10-digit expiry>.<16>.-.<43>.<43> (no partition:
# the bench's routes name no tenant): every proof of this key until 2286.
_FIELDS: Final = ("1" * 10, "1" * 10, "A" * 16, proof.NO_PARTITION, "A" * 43, "A" * 43)
WIDTH: Final = len(".".join((proof.VERSION, KEY_ID, *_FIELDS)))
# The processor's in-flight budget before the record's table is charged to it
# (config.Config's default): the bench raises it by the table, bodies keep as much.
BODY_BUDGET: Final = 256 * 1024 * 1024


def _digest(document: dict[str, Any], endpoint: str) -> bytes:
    digest = proof.prompt_digest(document, orjson_safe=False, endpoint=endpoint)
    if digest is None:  # only json.dumps renders it (the gateway charges that first)
        digest = proof.prompt_digest_slow(document, endpoint)
    return digest


def sign(
    document: dict[str, Any],
    endpoint: str = ENDPOINT,
    *,
    expiry: int = PLACEHOLDER_EXPIRY,
    nonce: bytes = bytes(proof.NONCE_BYTES),
) -> str:
    """A proof the gateway would have minted for ``document``'s transfer parameters
    (without a proof) on its prefill leg, for ``endpoint`` (the upstream path).
    Deterministic by default (the placeholder of ``bodies.build``)."""
    digest = _digest(document, endpoint)
    token = proof.mint(KEYS, document[KV_KEY], digest, expiry, nonce, minted=expiry - LIFETIME)
    if token is None:
        raise ValueError("the transfer parameters cannot be signed")
    return token


def mint_pool(
    data: bytes, count: int, *, expiry: int | None = None, endpoint: str = ENDPOINT
) -> bytes:
    """``count`` distinct proofs for the document ``data`` (a proven body), each
    ``WIDTH`` bytes, one after another. The nonces are a random prefix of this pool and
    a counter, so no two proofs of a pool are alike; pools of one run differ in their
    prefix (4 random bytes) and their expiry. ``expiry``: a lifetime from now unless
    given."""
    document = json.loads(data)
    until = int(time.time()) + LIFETIME if expiry is None else expiry
    make = proof.minter(
        KEYS, document[KV_KEY], _digest(document, endpoint), until, minted=until - LIFETIME
    )
    if make is None:
        raise ValueError("the transfer parameters cannot be signed")
    salt = secrets.token_bytes(4)
    pool = "".join(make(salt + index.to_bytes(8, "big")) for index in range(count)).encode()
    if len(pool) != count * WIDTH:
        raise ValueError(f"a proof is not {WIDTH} bytes long")
    return pool


def processor_config(
    folder: Path, *, record_url: str = "", record_slots: int = 65536
) -> dict[str, Any]:
    """The service's settings: the key (written to a file in ``folder``), a lifetime
    that outlives the longest cell, the record of spent proofs (``record_url``: "" for
    the processor's own table of ``record_slots`` proofs, or Redis) and an in-flight
    budget raised by the table's bytes (what bodies may hold stays the default)."""
    path = folder / f"proof-key-{KEY_ID}"
    path.write_bytes(SECRET)
    os.chmod(path, 0o600)
    settings: dict[str, Any] = {
        "keys": [{"id": KEY_ID, "file": str(path)}],
        "ttl_seconds": LIFETIME,
        "clock_skew_seconds": SKEW,
        "kv_lease_seconds": KV_LEASE,
        "record": record_url,
        "record_slots": record_slots,
    }
    budget = BODY_BUDGET + (0 if record_url else replay.table_bytes(record_slots))
    return {"proof": settings, "inflight_budget_bytes": budget}
