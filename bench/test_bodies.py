"""The matrix's bodies: exact sizes, realistic prompt text, the decisions they intend."""

from __future__ import annotations

import json

import pytest

from bench import bodies
from ext_proc.core import declared


@pytest.mark.parametrize("size", sorted(bodies.SIZES))
@pytest.mark.parametrize("decision", bodies.DECISIONS)
def test_every_body_has_its_exact_size(size: str, decision: str) -> None:
    body = bodies.build(size, decision)
    assert len(body.data) == bodies.SIZES[size]
    json.loads(body.data)  # valid JSON


def test_allow_is_a_long_realistic_prompt_without_ids() -> None:
    doc = json.loads(bodies.build("1m", "allow").data)
    assert "kv_transfer_params" not in doc
    prompt = doc["messages"][-1]["content"]
    assert len(doc["messages"]) == 4
    assert len(prompt) > 900_000
    for piece in ("\n", "\t", '"', "\\", "é", "東京", "🙂", "def "):
        assert piece in prompt


@pytest.mark.parametrize("size", sorted(bodies.SIZES))
def test_honor_and_honor_proven_send_the_same_bytes_to_two_routes(size: str) -> None:
    honor, proven = bodies.build(size, "honor"), bodies.build(size, "honor-proven")
    assert honor.data == proven.data
    assert honor.proof_at == proven.proof_at is not None
    assert (honor.path, proven.path) == (bodies.ANY_CALLER, bodies.DISAGGREGATED)
    params = json.loads(honor.data)["kv_transfer_params"]
    assert len(params["prompt_token_ids"]) == bodies.ID_COUNTS[size]


@pytest.mark.parametrize("size", sorted(bodies.SIZES))
def test_strict_sends_the_allow_bytes_every_member_declared(size: str) -> None:
    allow, strict = bodies.build(size, "allow"), bodies.build(size, "strict")
    assert strict.data == allow.data
    assert (allow.path, strict.path) == (bodies.AGGREGATED, bodies.STRICT)
    assert strict.path.startswith(bodies.STRICT_ROUTE)
    # The route's engine declares every member: the body is checked, then forwarded
    # unchanged, for the reason allow has.
    declared_body = declared.body(bodies.STRICT_ENGINE, strict.path)
    assert declared_body is not None
    assert declared.undeclared(json.loads(strict.data), declared_body, 65) == ()
    assert strict.expected_reason == allow.expected_reason
