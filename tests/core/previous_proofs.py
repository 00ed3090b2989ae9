"""Proofs as the releases before tp4 minted them, kept for the tests only: the processor
verifies none of them (docs/trust.md, "Proofs of an earlier format"), and these show what
it would have had to accept.

tp3 (and its turn proof, tt3) is ext_proc/core/proof.py as of cd17e31: tp4's MAC and
digest without the partition, so a tp3 proof names none and says nothing of where it
was minted.

tp2 is ext_proc/core/proof.py as of 207ae46^ (the last commit that minted it): HMAC-SHA256
keyed with the configured key, a SHA-256 prompt digest over the bound fields with sorted
keys. The canonical parameters (``proof.canonical``) and the unbound fields are unchanged
since. tp1 (1bea4f2 to 5e89bb2^: HMAC-SHA256, no nonce, no endpoint in its digest) is
only recognised by its shape, as is tp2, so the tests write its shape alone."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import blake3
import orjson

from ext_proc.core import proof


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def digest(document: Mapping[str, Any], endpoint: str) -> bytes:
    """tp2's prompt digest (orjson's rendering, which it took when it was
    exact): every object's members sorted, so their order is not bound."""
    bound = {k: v for k, v in document.items() if k not in proof.UNBOUND_FIELDS}
    rendered = orjson.dumps(bound, option=orjson.OPT_SORT_KEYS)
    named = endpoint.encode("utf-8", "surrogatepass")
    return hashlib.sha256(b"%d:%s%s" % (len(named), named, b"o") + rendered).digest()


def mint_tp2(
    key_id: str, key: bytes, params: Mapping[str, Any], digest: bytes, expiry: int, nonce: bytes
) -> str:
    body = proof.canonical(params)
    assert body is not None
    head, ids = body
    shown, text = _b64(digest), _b64(nonce)
    mac = hmac.new(key, "\n".join(("tp2", key_id, str(expiry), shown, "")).encode(), "sha256")
    mac.update(head + b"\n" + ids + b"\n" + text.encode())
    return f"tp2.{key_id}.{expiry}.{text}.{shown}.{_b64(mac.digest())}"


def mint_tp3(
    key_id: str,
    key: bytes,
    params: Mapping[str, Any],
    digest: bytes,
    expiry: int,
    nonce: bytes,
    version: str = "tp3",
) -> str:
    """A tp3 proof (``version`` tt3: a turn's) of ``params`` for a request with ``digest``
    (tp3's prompt digest is tp4's)."""
    body = proof.canonical(params)
    assert body is not None
    head, ids = body
    shown, text = _b64(digest), _b64(nonce)
    derived = blake3.blake3(key, derive_key_context="ext_proc token_policy_proof tp3 MAC key")
    mac = blake3.blake3(
        "\n".join((version, key_id, str(expiry), shown, "")).encode(), key=derived.digest()
    )
    mac.update(head + b"\n" + ids + b"\n" + text.encode())
    return f"{version}.{key_id}.{expiry}.{text}.{shown}.{_b64(mac.digest())}"
