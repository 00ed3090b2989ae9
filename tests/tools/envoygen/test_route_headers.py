"""envoygen.route_headers: a header that chooses a route, stated twice or with a list,
is refused by Envoy before the processor; the real Envoy's behaviour is checked in
tests/e2e/test_coordinator.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from ext_proc.tools import carrier_headers, envoygen
from ext_proc.tools.check_envoy import check
from ext_proc.tools.envoygen import route_headers
from tests.tools.envoygen.configs import INPUTS, example, filters_of, generate, hcm_of

CEL_HEADER = {
    "call_expr": {
        "function": "_[_]",
        "args": [
            {"select_expr": {"operand": {"ident_expr": {"name": "request"}}, "field": "headers"}},
            {"const_expr": {"string_value": "epp-profile"}},
        ],
    }
}


def coordinator() -> dict[str, Any]:
    return envoygen.read_input(INPUTS / "envoy-coordinator.yaml")


def test_a_config_whose_routes_match_a_header_refuses_it_stated_twice():
    config = generate(coordinator())
    names = [f["name"] for f in filters_of(config)]
    # After the header step (which nothing of it touches), before the processor.
    assert names[:3] == [carrier_headers.FILTER, route_headers.FILTER, envoygen.EXT_PROC_FILTER]
    rules = filters_of(config)[1]["typed_config"]["rules"]
    assert rules["action"] == "DENY"
    (policy,) = rules["policies"].values()
    assert (policy["permissions"], policy["principals"]) == ([{"any": True}], [{"any": True}])
    # request.headers['epp-profile'].contains(','): Envoy joins repeated values with ','.
    assert policy["condition"] == {
        "call_expr": {
            "target": CEL_HEADER,
            "function": "contains",
            "args": [{"const_expr": {"string_value": ","}}],
        }
    }
    # The denial becomes a 400 in vLLM's error shape, before every other mapper.
    first = hcm_of(config)["local_reply_config"]["mappers"][0]
    details = "rbac_access_denied_matched_policy[epp-profile-stated-twice]"
    assert first["status_code"] == 400
    assert f"response.code_details == '{details}'" in json.dumps(first["filter"])
    error = first["body_format_override"]["json_format"]["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", "%RESPONSE_CODE%")
    assert "epp-profile" in error["message"]
    assert check(config).errors == []


def test_a_config_without_such_routes_has_no_such_filter():
    config = generate(example())
    assert route_headers.FILTER not in [f["name"] for f in filters_of(config)]
    mappers = hcm_of(config)["local_reply_config"]["mappers"]
    assert all(m.get("status_code") != 400 for m in mappers)


def test_one_policy_per_header_name_however_many_routes_match_it():
    data = coordinator()
    data["routes"] = [
        {**data["routes"][0], "headers": {"epp-profile": "prefill", "x-tier": "a"}},
        *data["routes"][1:],
    ]
    (rbac,) = [f for f in filters_of(generate(data)) if f["name"] == route_headers.FILTER]
    assert list(rbac["typed_config"]["rules"]["policies"]) == [
        "epp-profile-stated-twice",
        "x-tier-stated-twice",
    ]


@pytest.mark.parametrize("value", ["decode,prefill", ","])
def test_a_matched_value_with_a_comma_is_refused(value):
    # Such a route could never be reached: its header would be refused first.
    data = coordinator()
    data["routes"][0] = {**data["routes"][0], "headers": {"epp-profile": value}}
    with pytest.raises(envoygen.GeneratorError, match=r"routes\.0\.headers"):
        envoygen.load_input(data)


def test_the_shipped_coordinator_config_carries_it():
    shipped = yaml.safe_load((INPUTS.parent / "envoy-coordinator.yaml").read_text())
    assert route_headers.FILTER in [f["name"] for f in filters_of(shipped)]
