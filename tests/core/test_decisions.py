"""The decision values: each names its action, and a strip names every member the
forwarded body goes without."""

import dataclasses

import pytest

from ext_proc.core.decisions import NO_PARAMS, Allow, Deny, Honor, Mint, Strip
from ext_proc.core.errors import Refusal
from ext_proc.core.vllm_request import KV_KEY

REFUSAL = Refusal(400, "BadRequestError", "some_reason", "refused")
CARRIERS = (("ec_transfer_params",), ("vllm_xargs", "kv_transfer_params"))


def test_each_decision_names_its_action():
    assert Allow("r").action == "allow"
    assert Mint("r").action == "mint"
    assert Deny(REFUSAL).action == "deny"
    assert Strip(None, "r", 0).action == "strip"
    assert Honor("r", 3).action == "honor"
    # Trusted parameters stay and only other carriers go: still an honor.
    assert Strip((), "r", 3, honored=True, carriers=CARRIERS).action == "honor"


def test_a_denial_reports_its_refusals_reason():
    assert Deny(REFUSAL).reason == REFUSAL.reason
    assert Deny(REFUSAL).id_count == 0


def test_stripping_the_whole_object_removes_it_and_the_carriers():
    assert Strip(None, "r", 0).paths == ((KV_KEY,),)
    assert Strip(None, "r", 0, carriers=CARRIERS).paths == ((KV_KEY,), *CARRIERS)


def test_stripping_keys_removes_each_from_the_object_and_the_carriers():
    keys = ("prompt_token_ids", "token_policy_proof")
    strip = Strip(keys, "r", 2, carriers=CARRIERS)
    assert strip.paths == ((KV_KEY, keys[0]), (KV_KEY, keys[1]), *CARRIERS)
    # Keeping everything removes only the carriers.
    assert Strip((), "r", 0, carriers=CARRIERS).paths == CARRIERS


def test_a_body_without_parameters_is_allowed_with_no_ids():
    assert isinstance(NO_PARAMS, Allow)
    assert NO_PARAMS.id_count == 0


@pytest.mark.parametrize(
    "decision", [Allow("r"), Strip(None, "r", 0), Mint("r"), Deny(REFUSAL)], ids=type
)
def test_decisions_are_frozen(decision):
    field = dataclasses.fields(decision)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(decision, field, None)
