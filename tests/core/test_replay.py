"""A proof is honored once (ext_proc/core/replay.py through the stream): the record's verdict
decides whether an honored decision stands."""

import dataclasses
import json

import pytest

from ext_proc.core import caller, proof
from ext_proc.core.decisions import Honor, Strip
from ext_proc.core.errors import ProtocolError
from ext_proc.core.events import (
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    Reject,
    RequestBody,
    RequestHeaders,
    RouteMetadata,
    StreamedBody,
)
from ext_proc.core.proof import Trust
from ext_proc.core.replay import Terms, Ticket, Verdict
from ext_proc.core.stream import State
from ext_proc.edge.record import LocalRecord
from tests.driver import DAY, Driven

KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")
NOW = 1000.0
TRUST = Trust(keys=lambda: KEYS, clock=lambda: NOW)
PATH = "/v1/chat/completions"
JSON = (("content-type", b"application/json"), ("x-request-id", b"r1"))
HONOR = RouteMetadata({"topology": "disaggregated", "action": "honor"}, 2.0)
HONOR_DENY = RouteMetadata(
    {"topology": "disaggregated", "action": "honor", "unproven": "deny"}, 3.0
)
PROMPT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
PARAMS = {"prompt_token_ids": [3, 4], "remote_block_ids": [1, 2], "remote_engine_id": "e"}


def decode_body(params=PARAMS, expiry=int(NOW) + 20):
    digest = proof.prompt_digest(PROMPT, True, PATH)
    token = proof.mint(KEYS, params, digest, expiry, minted=expiry - 20)
    return json.dumps({**PROMPT, "kv_transfer_params": {**params, proof.PROOF_KEY: token}})


BODY = decode_body()


def headers(route=HONOR, mode=BodyMode.BUFFERED):
    return RequestHeaders(JSON, False, mode, route, path=PATH)


def present(raw, record, route=HONOR, **options):
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST, spent=record, **options)
    stream.handle(headers(route))
    return stream, stream.handle(RequestBody(raw.encode(), True))


def unchanged(answers):
    """Whether the body was forwarded as it came (no replacement)."""
    return answers == [ContinueBody(None)]


def forwarded(answers):
    (answer,) = answers
    assert isinstance(answer, ContinueBody)
    return json.loads(answer.replacement)


def test_a_proof_is_honored_once_then_refused_as_a_replay():
    record = LocalRecord.anonymous(64, TRUST.clock, began=NOW - DAY)
    first, answers = present(BODY, record)
    assert first.decision == Honor("trusted_proof", 2)
    assert unchanged(answers)
    again, answers = present(BODY, record)
    assert again.decision.reason == "proof_replayed"
    assert again.decision.action == "strip"
    assert "kv_transfer_params" not in forwarded(answers)  # the decode recomputes


def test_a_replay_is_a_400_on_a_route_that_denies_unproven_parameters():
    record = LocalRecord.anonymous(64, TRUST.clock, began=NOW - DAY)
    present(BODY, record, HONOR_DENY)
    stream, answers = present(BODY, record, HONOR_DENY)
    (answer,) = answers
    assert isinstance(answer, Reject)
    assert answer.status == 400
    assert answer.details == "token_policy_proof_replayed"
    assert stream.budget.used == 0


def test_the_same_parameters_under_another_proof_are_another_ticket():
    record = LocalRecord.anonymous(64, TRUST.clock, began=NOW - DAY)
    present(BODY, record)
    stream, _ = present(decode_body(expiry=int(NOW) + 19), record)
    assert stream.decision.reason == "trusted_proof"


def test_a_streamed_body_waits_for_the_verdict_and_is_answered_once():
    record = LocalRecord.anonymous(64, TRUST.clock, began=NOW - DAY)
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST, spent=record)
    stream.handle(headers(mode=BodyMode.FULL_DUPLEX_STREAMED))
    step = stream.stream.handle(RequestBody(BODY.encode(), True))
    assert step.answers == []
    assert step.outcome is None  # nothing reported before the verdict
    assert step.ask is not None
    # Kept for the proof's expiry and three skews; minted after a skew before its minting.
    assert step.ask.expires_at == int(NOW) + 20 + 3 * 5
    assert step.ask.minted_after == int(NOW) - 5
    answers = stream.stream.spent(Verdict.FIRST).answers
    assert answers[0] == ContinueHeaders()
    assert all(isinstance(a, StreamedBody) for a in answers[1:])


@pytest.mark.parametrize(
    "verdict", [Verdict.SPENT, Verdict.PREDATES, Verdict.FULL, Verdict.CLOCK_BEHIND]
)
def test_every_verdict_that_judges_the_proof_leaves_it_unproven(verdict):
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST)
    stream.handle(headers())
    step = stream.stream.handle(RequestBody(BODY.encode(), True))
    assert step.ask is not None
    done = stream.stream.spent(verdict)
    assert done.outcome is not None
    assert done.outcome.decision.reason == verdict.value
    (answer,) = done.answers
    assert "kv_transfer_params" not in json.loads(answer.replacement)


def assert_unavailable(step):
    """The request refused with a 503 a client retries (vLLM's error shape, nothing of
    the deployment in it), counted under proof_record_unavailable; nothing forwarded."""
    (answer,) = step.answers
    assert isinstance(answer, Reject)
    assert answer.status == 503
    assert answer.headers == (("retry-after", b"1"),)
    assert answer.details == "token_policy_proof_record_unavailable"
    error = json.loads(answer.body)["error"]
    assert error["type"] == "ServiceUnavailableError"
    assert error["code"] == 503
    assert error["param"] is None
    assert "record of spent proofs" in error["message"]
    assert "retry" in error["message"]
    assert "redis" not in error["message"].lower()
    assert step.outcome is not None
    assert step.outcome.decision.action == "deny"
    assert step.outcome.decision.reason == "proof_record_unavailable"
    assert step.final


@pytest.mark.parametrize("audit", [False, True])
@pytest.mark.parametrize("mode", [BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED])
def test_a_record_that_cannot_be_consulted_refuses_the_request_in_every_mode(audit, mode):
    """Not a finding about the request: audit mode refuses it too. The decode leg is
    never forwarded to recompute what its proof would have read."""
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST, audit=audit)
    stream.handle(headers(mode=mode))
    step = stream.stream.handle(RequestBody(BODY.encode(), True))
    assert step.ask is not None
    assert_unavailable(stream.stream.spent(Verdict.UNAVAILABLE))
    assert stream.state is State.REJECTED
    assert stream.budget.used == 0


def test_a_proof_minted_before_the_record_began_is_unproven_and_recomputed():
    """A real record that began after the proof was minted (a processor restarted
    whole) can never vouch for it: no retry would be honored, so the decode leg goes
    on without the parameters (it recomputes), named for the reason, not a 503."""
    record = LocalRecord.anonymous(64, lambda: NOW + 1, began=NOW + 1)
    stream, answers = present(BODY, record)
    assert isinstance(stream.decision, Strip)
    assert stream.decision.reason == "proof_predates_record"
    (answer,) = answers
    assert json.loads(answer.replacement) == PROMPT
    assert stream.budget.used == 0


def test_a_proof_minted_before_the_record_began_is_refused_where_unproven_is_denied():
    record = LocalRecord.anonymous(64, lambda: NOW + 1, began=NOW + 1)
    stream, (answer,) = present(BODY, record, HONOR_DENY)
    assert isinstance(answer, Reject)
    assert answer.status == 400
    assert answer.details == "token_policy_proof_predates_record"
    assert stream.decision.reason == "proof_predates_record"


def test_audit_mode_reports_a_proof_minted_before_the_record_began_and_forwards_it():
    record = LocalRecord.anonymous(64, lambda: NOW + 1, began=NOW + 1)
    stream, answers = present(BODY, record, audit=True)
    assert stream.decision.reason == "proof_predates_record"
    assert answers == [ContinueBody(None)]


def test_audit_mode_spends_the_proof_and_reports_a_replay_but_forwards_unchanged():
    record = LocalRecord.anonymous(64, TRUST.clock, began=NOW - DAY)
    present(BODY, record, audit=True)
    stream, answers = present(BODY, record, audit=True)
    assert stream.decision.reason == "proof_replayed"
    assert answers == [ContinueBody(None)]


def test_nothing_but_the_verdict_is_accepted_while_the_record_is_asked():
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST)
    stream.handle(headers())
    assert stream.stream.handle(RequestBody(BODY.encode(), True)).ask is not None
    with pytest.raises(ProtocolError):
        stream.stream.handle(RequestBody(b"{}", True))
    assert stream.budget.used == 0


def test_the_answers_after_the_verdict_end_the_stream_not_the_question():
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST)
    declared = RequestHeaders(JSON, False, BodyMode.BUFFERED, HONOR, path=PATH)
    stream.handle(dataclasses.replace(declared, response_body_mode=BodyMode.NONE))
    asking = stream.stream.handle(RequestBody(BODY.encode(), True))
    assert asking.ask is not None
    assert not asking.final  # nothing answered yet
    done = stream.stream.spent(Verdict.FIRST)
    assert done.answers == [ContinueBody(None)]
    assert done.final


def test_a_verdict_nobody_asked_for_is_a_protocol_error():
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST)
    stream.handle(headers())
    with pytest.raises(ProtocolError):
        stream.stream.spent(Verdict.FIRST)


def test_parameters_trusted_for_another_reason_spend_nothing():
    trusted = RouteMetadata(
        {"topology": "disaggregated", "action": "honor", "trust_any_caller": True}, 3.0
    )
    stream = Driven(max_body_bytes=1 << 20, trust=TRUST)
    stream.handle(headers(trusted))
    step = stream.stream.handle(RequestBody(BODY.encode(), True))
    assert step.ask is None
    assert step.outcome is not None
    assert step.outcome.decision.reason == "trusted_any_caller"


def test_who_the_caller_is_is_decided_once_for_a_request_decided_twice(monkeypatch):
    asked = []
    of = caller.of
    monkeypatch.setattr(caller, "of", lambda *args: asked.append(args) or of(*args))
    record = LocalRecord.anonymous(64, TRUST.clock, began=NOW - DAY)
    present(BODY, record)
    assert len(asked) == 1
    again, _ = present(BODY, record)  # decided again: proof_replayed
    assert again.decision.reason == "proof_replayed"
    assert len(asked) == 2


# --- a record's terms ---------------------------------------------------------------------


def test_a_record_keeps_and_dates_a_ticket_under_the_largest_skew_of_its_writers():
    own = Terms(skew=1)
    kept = own.joined(Terms(skew=10))
    assert kept == Terms(skew=10)
    assert kept.covers(own)
    assert not own.covers(kept)
    prefill = Ticket(b"p" * 16, 100 + 3 * 1, 80 - 1)
    # Kept 3 x 9 s longer, dated 9 s earlier.
    assert kept.widened(prefill, own) == Ticket(b"p" * 16, 100 + 3 * 10, 80 - 10)
    assert own.widened(prefill, own) == prefill
