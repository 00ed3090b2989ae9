"""The benchmark's signing key and the proofs its proven bodies carry (docs/trust.md).

The key is derived from a constant and the expiry lies far ahead, so a proven body is
the same bytes in every run (a benchmark's key guards nothing); the service verifies
it with the same key, read from the file ``processor_config`` writes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Final

from ext_proc import proof
from ext_proc.vllm_request import KV_KEY

KEY_ID: Final = "bench"
SECRET: Final = hashlib.sha256(b"ext_proc benchmark proof key").hexdigest().encode()
EXPIRY: Final = 4_102_444_800  # 2100-01-01: unexpired whenever the run happens
_KEYS: Final = proof.KeySet({KEY_ID: SECRET}, KEY_ID)


def sign(document: dict[str, Any], endpoint: str = "/v1/chat/completions") -> str:
    """The proof the gateway would have minted for ``document``'s transfer parameters
    (without a proof) on its prefill leg, for ``endpoint`` (the upstream path)."""
    digest = proof.prompt_digest(document, orjson_safe=False, endpoint=endpoint)
    if digest is None:  # only json.dumps renders it (the gateway charges that first)
        digest = proof.prompt_digest_slow(document, endpoint)
    token = proof.mint(_KEYS, document[KV_KEY], digest, EXPIRY)
    if token is None:
        raise ValueError("the transfer parameters cannot be signed")
    return token


def processor_config(folder: Path) -> dict[str, Any]:
    """The service's ``proof`` settings, the key written to a file in ``folder``."""
    path = folder / f"proof-key-{KEY_ID}"
    path.write_bytes(SECRET)
    os.chmod(path, 0o600)
    return {"proof": {"keys": [{"id": KEY_ID, "file": str(path)}]}}
