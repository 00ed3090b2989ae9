import json

import pytest

from ext_proc.core import memory, mint, proof, reading, vllm_request
from ext_proc.core.budget import Account, Budget
from ext_proc.core.decisions import Allow, Mint, Strip
from ext_proc.core.errors import ProtocolError
from ext_proc.core.events import (
    ContinueBody,
    ContinueResponseBody,
    ContinueResponseHeaders,
    Reject,
    RequestBody,
    RequestHeaders,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
)
from ext_proc.core.proof import Trust
from ext_proc.core.stream import State
from tests.core.messages import (
    AGGREGATED,
    BUFFERED,
    CHAT_PATH,
    DUPLEX,
    JSON,
    KEYS,
    MINT_ROUTE,
    OK_JSON,
    PREFILL,
    REWRITTEN_MINT,
    deep,
    headers,
    new,
    only,
    prefill_stream,
    streamed,
)
from tests.driver import Driven

DIGEST = b"d" * 32
NO_KEYS = proof.NO_KEYS
OK = ((":status", b"200"), ("content-type", b"application/json"))


def signing(limit=1 << 20, budget=1 << 30, keys=KEYS):
    return mint.Signing(
        Account(Budget(budget)), limit, 100_000, keys, 2_000_000_000 - 20, 2_000_000_000
    )


def test_only_chat_completions_responses_are_signed():
    rendered = []

    def digest():
        rendered.append(1)
        return DIGEST

    assert mint.expect("/v1/chat/completions", digest) == mint.Pending(DIGEST)
    assert mint.expect("/v1/completions", digest) == mint.Pending(None, "endpoint_not_mintable")
    assert len(rendered) == 1  # rendered only where it is kept


@pytest.mark.parametrize(
    ("alone", "decision", "kept"),
    [
        (True, Strip(None, "unproven", 0), True),
        (False, Strip(None, "unproven", 0), False),
        (False, Allow("trusted_peer", 0), True),
    ],
)
def test_a_request_naming_a_carrier_elsewhere_is_signed_only_for_a_trusted_caller(
    alone, decision, kept
):
    judged = mint.judged(mint.Pending(DIGEST), decision, alone)
    assert judged == (mint.Pending(DIGEST) if kept else mint.Pending(None, "request_may_echo"))


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (OK, None),
        (((":status", b"201"), OK[1]), "response_not_ok"),
        ((OK[0], ("content-type", b"text/plain")), "response_not_json"),
        ((OK[0],), "response_not_json"),
        ((*OK, OK[1]), "response_not_json"),
        ((*OK, ("content-encoding", b"gzip")), "response_encoded"),
        ((*OK, ("content-encoding", b"identity")), None),
    ],
)
def test_only_a_plain_json_200_is_signed(headers, reason):
    checked = mint.checked(mint.Pending(DIGEST), ResponseHeaders(headers, False))
    assert checked == (mint.Pending(DIGEST) if reason is None else mint.Pending(None, reason))
    # A reason found with the request stands.
    assert mint.checked(mint.NOTHING, ResponseHeaders(headers, False)) == mint.NOTHING


def test_a_response_is_signed_and_written_back():
    raw = json.dumps({"id": "x", "prompt_token_ids": [1, 2], "kv_transfer_params": {"p": 7}})
    decision, signed = mint.sign(mint.Pending(DIGEST), raw.encode(), signing())
    assert decision == Mint("minted", 2)
    params = json.loads(signed)["kv_transfer_params"]
    assert params["prompt_token_ids"] == [1, 2]
    assert params["p"] == 7
    assert params[proof.PROOF_KEY].startswith("tp4.k1.")


@pytest.mark.parametrize(
    ("pending", "raw", "options", "reason"),
    [
        (mint.Pending(None, "response_not_ok"), b"{}", {}, "response_not_ok"),
        (mint.Pending(DIGEST), b"x" * 200, {"limit": 100}, "response_not_affordable"),
        (mint.Pending(DIGEST), b'{"a": 1}', {"budget": 10}, "response_not_affordable"),
        (mint.Pending(DIGEST), b"[1]", {}, "response_not_json"),
        (mint.Pending(DIGEST), b'{"a": 1}', {}, "nothing_to_mint"),
        (
            mint.Pending(DIGEST),
            b'{"prompt_token_ids": [1]}',
            {"keys": proof.NO_KEYS},
            "no_signing_key",
        ),
    ],
)
def test_a_response_that_is_not_signed_passes_unchanged(pending, raw, options, reason):
    assert mint.sign(pending, raw, signing(**options)) == (Allow(reason), None)


def test_a_response_with_connector_values_out_of_bounds_passes_unsigned():
    # vllm#51137: a tp_size the decode side would allocate by is never signed.
    connector = {"remote_port": 5600, "tp_size": 20_000_000, "remote_block_ids": [[1]]}
    raw = json.dumps({"id": "x", "prompt_token_ids": [1, 2], "kv_transfer_params": connector})
    assert mint.sign(mint.Pending(DIGEST), raw.encode(), signing()) == (
        Allow("response_connector_out_of_bounds"),
        None,
    )
    # In bounds, the same response is signed.
    raw = raw.replace("20000000", "2")
    decision, signed = mint.sign(mint.Pending(DIGEST), raw.encode(), signing())
    assert decision == Mint("minted", 2)
    assert json.loads(signed)["kv_transfer_params"]["tp_size"] == 2


def response_outcome(stream, headers_=OK_JSON, raw=None):
    stream.outcome = None
    assert stream.handle(ResponseHeaders(headers_, raw is None)) == [ContinueResponseHeaders()]
    if raw is None:
        return None
    (answer,) = stream.handle(ResponseBody(raw, True))
    assert isinstance(answer, ContinueResponseBody)
    assert stream.state is State.RESPONSE_DONE
    return answer


def test_mint_signs_the_response_parameters():
    stream = prefill_stream()
    response = {"id": "c", "prompt_token_ids": [3, 4], "kv_transfer_params": None}
    answer = response_outcome(stream, raw=json.dumps(response).encode())
    assert stream.outcome.phase == "response"
    assert stream.outcome.decision == Mint("minted", 2)
    minted = json.loads(answer.replacement)
    params = minted.pop("kv_transfer_params")
    assert minted == {"id": "c", "prompt_token_ids": [3, 4]}
    assert params["prompt_token_ids"] == [3, 4]
    digest = proof.prompt_digest(json.loads(PREFILL), True, CHAT_PATH)
    assert proof.verify(KEYS, params, digest, now=1000.0, skew=0) is None
    expiry = 1000 + stream.config.proof.ttl_seconds
    # Minted at the clock, for ttl.
    assert params[proof.PROOF_KEY].split(".")[2:4] == ["1000", str(expiry)]


@pytest.mark.parametrize(
    ("headers_", "reason"),
    [
        (((":status", b"500"), ("content-type", b"application/json")), "response_not_ok"),
        (((":status", b"200"), ("content-type", b"text/event-stream")), "response_not_json"),
        ((*OK_JSON, ("content-encoding", b"gzip")), "response_encoded"),
    ],
)
def test_other_responses_pass_unchanged(headers_, reason):
    stream = prefill_stream()
    answer = response_outcome(stream, headers_, b'{"prompt_token_ids": [1]}')
    assert answer == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow(reason)


def test_a_response_that_is_not_json_passes_unchanged():
    stream = prefill_stream()
    assert response_outcome(stream, raw=b"{oops") == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_not_json")


def test_a_response_whose_parameters_cannot_be_rendered_exactly_passes_unsigned():
    # orjson refuses NaN, json.loads reads it, and canonical() cannot sign it.
    budget = Budget(1 << 30)
    stream = prefill_stream(budget=budget)
    raw = b'{"prompt_token_ids": [1], "kv_transfer_params": {"x": NaN}}'
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("not_renderable")
    assert budget.used == 0


PREFILL_COST = memory.cost(len(PREFILL), reading.scan(PREFILL).values)


def padded(size):
    """A response the stream would sign, exactly ``size`` bytes long."""
    head = b'{"prompt_token_ids": [1], "pad": "'
    return head + b"a" * (size - len(head) - 2) + b'"}'


@pytest.mark.parametrize(
    ("limits", "raw"),
    [
        pytest.param({}, padded((1 << 20) + 1), id="over_max_body_bytes"),
        pytest.param(
            {"max_json_values": reading.scan(PREFILL).values},
            json.dumps({"prompt_token_ids": list(range(1, 64))}).encode(),
            id="over_max_json_values",
        ),
        pytest.param({"budget_limit": PREFILL_COST}, padded(4 * len(PREFILL)), id="over_budget"),
    ],
)
def test_a_response_the_stream_cannot_afford_passes_unsigned_and_is_never_charged(limits, raw):
    values = limits.get("max_json_values", memory.MAX_JSON_VALUES)
    budget = Budget(limits.get("budget_limit", memory.largest(1 << 20, values)))
    stream = prefill_stream(budget=budget, max_json_values=values)
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_not_affordable")
    assert budget.peak == PREFILL_COST  # the request's charge; none for the response
    assert budget.used == 0


@pytest.mark.parametrize(
    ("limit", "raw"),
    [
        # orjson reads 1000 levels but writes 254; json.dumps hits the recursion limit.
        pytest.param(1 << 20, deep(1000), id="past_the_recursion_limit"),
        # 300 levels in a body json.dumps may not write (over SLOW_PARSE_MAX_BYTES).
        pytest.param(
            2 * memory.SLOW_PARSE_MAX_BYTES,
            deep(300).replace(b'"x":', b'"pad":"' + b"a" * memory.SLOW_PARSE_MAX_BYTES + b'","x":'),
            id="over_the_json_dumps_size",
        ),
    ],
)
def test_a_response_too_deep_to_write_back_passes_unsigned(limit, raw):
    budget = Budget(memory.largest(limit, memory.MAX_JSON_VALUES))
    stream = prefill_stream(limit, budget=budget)
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_too_deep")
    assert budget.used == 0


def test_a_response_whose_rewrite_the_budget_cannot_hold_passes_unsigned():
    # 300 levels: orjson reads it, only json.dumps writes it, and its extra charge does
    # not fit in a budget that holds the parsed response alone.
    raw = deep(300)
    budget = Budget(memory.cost(len(raw), reading.scan(raw).values))
    stream = prefill_stream(budget=budget)
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_not_affordable")
    assert budget.used == 0


def test_audit_records_the_mint_but_changes_nothing():
    stream = prefill_stream(audit=True)
    answer = response_outcome(stream, raw=b'{"prompt_token_ids": [1]}')
    assert answer == ContinueResponseBody(None)
    assert stream.outcome.decision == Mint("minted", 1)


def test_only_mint_routes_sign():
    stream = Driven(max_body_bytes=1 << 20, trust=Trust(keys=lambda: KEYS))
    stream.handle(headers(AGGREGATED))
    stream.handle(RequestBody(PREFILL, True))
    answer = response_outcome(stream, raw=b'{"prompt_token_ids": [1]}')
    assert answer == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("not_minted_on_this_route")


def test_a_response_without_body_is_reported():
    stream = prefill_stream()
    assert response_outcome(stream, OK_JSON) is None
    assert stream.outcome.decision == Allow("response_without_body")


@pytest.mark.parametrize("with_body", [True, False])
def test_a_response_whose_request_the_processor_never_saw_passes_unsigned(with_body):
    # Envoy sends a mint route's response even when the request never reached the
    # processor: one without a body (one message per request), or Envoy's own answer or
    # an earlier filter's (a buffer limit's 413, a route header stated twice).
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    answers = stream.handle(ResponseHeaders(OK_JSON, not with_body))
    assert answers == [ContinueResponseHeaders()]
    if with_body:
        # Everything a prefill response carries, and still nothing is signed.
        answers = stream.handle(ResponseBody(SIGNED_RESPONSE, True))
        assert answers == [ContinueResponseBody(None)]
    assert stream.outcome is not None
    assert (stream.outcome.phase, stream.outcome.decision) == (
        "response",
        Allow("not_minted_on_this_route"),
    )
    with pytest.raises(ProtocolError):  # and then nothing more
        stream.handle(RequestBody(PREFILL, True))


SIGNED_RESPONSE = json.dumps({"id": "c", "prompt_token_ids": [3, 4]}).encode()


@pytest.mark.parametrize(
    ("route", "path", "minted"),
    [
        (MINT_ROUTE, "/v1/chat/completions", True),
        (REWRITTEN_MINT, "/pd/prefill/v1/chat/completions", True),
        (REWRITTEN_MINT, "/pd/prefill/v1/chat/%63ompletions", True),  # vLLM decodes it
        # Endpoints that can echo the request, or whose ids are the request's.
        (MINT_ROUTE, "/v1/chat/completions/derender", False),
        (MINT_ROUTE, "/v1/completions/derender", False),
        (MINT_ROUTE, "/v1/chat/completions/render", False),
        (MINT_ROUTE, "/v1/completions", False),
        (MINT_ROUTE, "/v1/embeddings", False),
        (MINT_ROUTE, "/tokenize", False),
        (MINT_ROUTE, "/v1/messages", False),
        (MINT_ROUTE, "/v1/responses", False),
        (REWRITTEN_MINT, "/pd/prefill/v1/chat/completions/derender", False),
        # Without the rewrite metadata the route's own path is not chat completions.
        (MINT_ROUTE, "/pd/prefill/v1/chat/completions", False),
    ],
)
def test_a_mint_route_signs_only_chat_completions(route, path, minted):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(route, path=path))
    assert stream.handle(RequestBody(PREFILL, True)) == [ContinueBody(None)]
    answer = response_outcome(stream, raw=SIGNED_RESPONSE)
    if minted:
        assert stream.outcome.decision == Mint("minted", 2)
        assert answer.replacement is not None
    else:
        assert stream.outcome.decision == Allow("endpoint_not_mintable")
        assert answer.replacement is None


def test_a_proof_minted_for_chat_completions_is_a_mismatch_elsewhere():
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    stream.handle(RequestBody(PREFILL, True))
    answer = response_outcome(stream, raw=SIGNED_RESPONSE)
    params = json.loads(answer.replacement)["kv_transfer_params"]
    decode = {**json.loads(PREFILL), "kv_transfer_params": params}
    honor = RouteMetadata({"topology": "disaggregated", "action": "honor"}, 2.0)
    for path, reason in [
        ("/v1/chat/completions", "trusted_proof"),
        ("/v1/messages", "prompt_mismatch"),
        ("/v1/responses", "prompt_mismatch"),
    ]:
        stream = Driven(max_body_bytes=1 << 20, trust=trust)
        stream.handle(headers(honor, path=path))
        stream.handle(RequestBody(json.dumps(decode).encode(), True))
        assert stream.outcome.decision.reason == reason


@pytest.mark.parametrize(
    "extra",
    [
        # A member named as a carrier where vLLM reads none: its content could still
        # come back in a response, so nothing the response carries is signed.
        {"messages": [{"role": "user", "content": "hi", "kv_transfer_params": {"a": 1}}]},
        {"metadata": {"ec_transfer_params": {"a": 1}}},
        # Only the bytes are read for this: a string that is the name blocks it too.
        {"messages": [{"role": "user", "content": "kv_transfer_params"}]},
        # Two top-level members of the name (the last wins in vLLM's reading).
        "duplicate",
    ],
)
def test_a_mint_route_signs_nothing_for_a_request_that_names_a_carrier_elsewhere(extra):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    if extra == "duplicate":
        raw = b'{"kv_transfer_params": {"x": 1}, "messages": [], "kv_transfer_params": {}}'
    else:
        raw = json.dumps({**json.loads(PREFILL), **extra}).encode()
    (answer,) = stream.handle(RequestBody(raw, True))
    assert isinstance(answer, ContinueBody)
    answer = response_outcome(stream, raw=SIGNED_RESPONSE)
    assert stream.outcome.decision == Allow("request_may_echo")
    assert answer.replacement is None


def test_a_mint_route_signs_for_a_request_with_only_its_own_parameters():
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    raw = json.dumps({**json.loads(PREFILL), "kv_transfer_params": {"do_remote_decode": True}})
    stream.handle(RequestBody(raw.encode(), True))
    response_outcome(stream, raw=SIGNED_RESPONSE)
    assert stream.outcome.decision == Mint("minted", 2)


@pytest.mark.parametrize(
    "extra",
    [
        {"tokens": {"token_ids": [1, 2], "features": None}},
        {"nvext": {"token_data": [1, 2]}},
        {"prompt_token_ids": [1, 2]},
        {"request_id": "r"},
    ],
)
def test_a_mint_route_signs_for_a_request_whose_other_stacks_carriers_it_removed(extra):
    # vLLM reads none of these: removed, they cannot come back in the response (an
    # orchestrator such as llm-d's coordinator writes ``tokens`` into its prefill leg).
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    raw = json.dumps({**json.loads(PREFILL), **extra}).encode()
    (answer,) = stream.handle(RequestBody(raw, True))
    assert answer.replacement is not None
    emptied = {"nvext": {}} if "nvext" in extra else {}  # only the carrier's member goes
    assert json.loads(answer.replacement) == {**json.loads(PREFILL), **emptied}
    response_outcome(stream, raw=SIGNED_RESPONSE)
    assert stream.outcome.decision == Mint("minted", 2)


def test_one_message_per_request_gets_the_path_before_the_rewrite():
    # The buffer filter keeps the headers from the router: the attributes show the
    # path the client sent, rewritten by the processor as the router will.
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    for path, minted in [
        ("/pd/prefill/v1/chat/completions", True),
        ("/pd/prefill/v1/chat/completions/derender", False),
    ]:
        stream = Driven(max_body_bytes=1 << 20, trust=trust)
        preamble = RequestHeaders(JSON, False, BUFFERED, REWRITTEN_MINT, path=path)
        assert stream.handle(RequestBody(PREFILL, True, preamble)) == [
            ContinueBody(None, length_header=True)
        ]
        response_outcome(stream, raw=SIGNED_RESPONSE)
        assert stream.outcome.decision.action == ("mint" if minted else "allow")
    # An already rewritten path: the metadata does not describe the route that matched.
    stream = new()
    preamble = RequestHeaders(JSON, False, BUFFERED, REWRITTEN_MINT, path="/v1/chat/completions")
    (answer,) = stream.handle(RequestBody(PREFILL, True, preamble))
    assert isinstance(answer, Reject)
    assert answer.details == "token_policy_invalid_route_policy"
    assert stream.last is not None
    assert stream.last.outcome is not None
    denied = stream.last.outcome.decision
    assert "match_prefix" in denied.refusal.detail


NIXL_ROUTE = RouteMetadata(
    {"topology": "disaggregated", "action": "mint", "connector": "nixl"}, 3.0
)


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
@pytest.mark.parametrize(
    "params", [None, {"remote_host": "10.0.0.7", "do_remote_decode": True, "prompt_token_ids": [1]}]
)
def test_a_connector_route_forwards_its_connector_request_and_signs_the_answer(mode, params):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(NIXL_ROUTE, mode=mode))
    sent = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if params is not None:
        sent["kv_transfer_params"] = params
    answers = stream.handle(RequestBody(json.dumps(sent).encode(), True))
    forwarded = json.loads(streamed(answers) if mode is DUPLEX else only(answers).replacement)
    assert forwarded["kv_transfer_params"] == vllm_request.CONNECTOR_REQUESTS["nixl"]
    assert {k: v for k, v in forwarded.items() if k != "kv_transfer_params"} == {
        k: v for k, v in sent.items() if k != "kv_transfer_params"
    }
    assert stream.decision.action == "strip"
    assert stream.decision.reason == ("connector_written" if params is None else "unproven")
    reply = {"prompt_token_ids": [5], "kv_transfer_params": {"remote_engine_id": "e"}}
    answer = response_outcome(stream, raw=json.dumps(reply).encode())
    minted = json.loads(answer.replacement)["kv_transfer_params"]
    assert minted["remote_engine_id"] == "e"
    assert minted["prompt_token_ids"] == [5]
    assert stream.outcome.decision == Mint("minted", 1)
