"""The benchmark's extra routes (no process): copies of shipped routes under another
prefix state their own rewrite, as the processor needs, and pass check-envoy."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import bodies, stack
from devstack import envoy_config
from ext_proc.core import native
from ext_proc.core.address import HostPort
from ext_proc.tools import carrier_headers, envoygen
from ext_proc.tools.check_envoy import check
from ext_proc.tools.envoygen.inputs import read_metadata

ANYWHERE = HostPort("127.0.0.1", 1)


def _rendered() -> dict[str, Any]:
    return envoy_config.render(
        gateway=ANYWHERE,
        admin=ANYWHERE,
        processor=ANYWHERE,
        aggregated=ANYWHERE,
        disaggregated=ANYWHERE,
    )


def _route(config: dict[str, Any], name: str) -> dict[str, Any]:
    (vhost,) = stack._hcm(config)["route_config"]["virtual_hosts"]
    (route,) = [r for r in vhost["routes"] if r["name"] == name]
    return dict(route)


def test_the_any_caller_route_states_its_own_prefix() -> None:
    config = _rendered()
    stack._add_any_caller_route(config)
    extra = _route(config, "disaggregated-any-caller")
    fields = extra["metadata"]["filter_metadata"][stack.POLICY]
    assert fields["trust_any_caller"] is True
    assert (fields["match_prefix"], fields["prefix_rewrite"]) == (bodies.ANY_CALLER_ROUTE, "/v1/")
    assert extra["route"]["prefix_rewrite"] == "/v1/"
    report = check(config)
    # trust_any_caller is reported as the warning it is; nothing else.
    assert report.errors == []
    assert [w for w in report.warnings if "trust_any_caller" not in w] == []


def test_the_strict_route_is_the_aggregated_route_naming_an_engine() -> None:
    config = _rendered()
    shipped = _route(config, stack.AGGREGATED_ROUTE)
    stack._add_strict_route(config)
    strict = _route(config, "aggregated-strict")
    fields = strict["metadata"]["filter_metadata"][stack.POLICY]
    shipped_fields = shipped["metadata"]["filter_metadata"][stack.POLICY]
    # What the aggregated route states, and the engine; no rewrite, as the route has none.
    assert fields == {**shipped_fields, "strict_body": bodies.STRICT_ENGINE}
    assert "prefix_rewrite" not in strict["route"]
    assert strict["match"] == {"prefix": bodies.STRICT_ROUTE}
    assert {k: v for k, v in strict.items() if k not in ("name", "match", "metadata")} == {
        k: v for k, v in shipped.items() if k not in ("name", "match", "metadata")
    }
    # The policy it carries is one the processor reads, the engine one it knows.
    assert read_metadata(fields).strict_body == bodies.STRICT_ENGINE
    (vhost,) = stack._hcm(config)["route_config"]["virtual_hosts"]
    names = [r["name"] for r in vhost["routes"]]
    assert names.index("aggregated-strict") < names.index(stack.AGGREGATED_ROUTE)
    # check-envoy also refuses an ext_proc filter that does not request every policy
    # field as a CEL attribute (strict_body among them): none is missing.
    report = check(config)
    assert (report.errors, report.warnings) == ([], [])


def _pieces(config: dict[str, Any]) -> dict[str, bool]:
    hcm = stack._hcm(config)
    names = [f["name"] for f in hcm["http_filters"]]
    (vhost,) = hcm["route_config"]["virtual_hosts"]
    ext_proc = [f for f in hcm["http_filters"] if f["name"] == envoygen.EXT_PROC_FILTER]
    return {
        "routes": any("direct_response" in r for r in vhost["routes"]),
        "log": "access_log" in hcm,
        "header_step": carrier_headers.FILTER in names,
        "ext_proc": envoygen.EXT_PROC_FILTER in names and envoygen.BUFFER_FILTER in names,
        "attributes": bool(ext_proc) and "request_attributes" in ext_proc[0]["typed_config"],
    }


def test_each_envoy_rung_has_the_pieces_up_to_it_and_none_above() -> None:
    shipped = _pieces(_rendered())
    assert all(shipped.values())  # the shipped config has every piece the ladder cuts
    for at, rung in enumerate(stack.ENVOY_RUNGS):
        config = _rendered()
        stack.cut_envoy(config, rung)
        expected = {piece: stack.ENVOY_RUNGS.index(piece) <= at for piece in shipped}
        assert _pieces(config) == expected, rung
        assert set(stack.ENVOY_ADDS) == set(stack.ENVOY_RUNGS)


def test_envoy_direct_is_the_log_rung_and_has_no_processor_rung() -> None:
    direct = _rendered()
    stack._remove_ext_proc(direct, "log")
    rung = _rendered()
    stack.cut_envoy(rung, "log")
    assert direct == rung
    with pytest.raises(ValueError, match="no processor"):
        stack._remove_ext_proc(_rendered(), "ext_proc")


def test_a_native_arrangement_names_its_compiled_parts_and_sets_them_for_itself() -> None:
    scan_wire = stack.Arrangement("service", 1, native="core._scan,edge._wire")
    assert scan_wire.name == "service-w1-native-scan-wire"
    assert not scan_wire.default
    env = scan_wire.environment()
    assert env is not None
    assert env[native.ENVIRONMENT] == "core._scan,edge._wire"
    assert env["PATH"] == os.environ["PATH"]  # the harness's environment otherwise
    assert stack.Arrangement("service", 2, native="0").name == "service-w2-native-none"
    assert stack.Arrangement("service", 1, native="1").name == "service-w1-native-all"
    assert stack.native_suffix(" core._shape , core._ids ") == "shape-ids"
    # Other arrangements keep the environment they inherit.
    assert stack.Arrangement("service", 1).environment() is None
    assert stack.Arrangement("naive").environment() is None


@pytest.mark.parametrize("value", ["core._nothing", "core._scan,", "scan"])
def test_a_native_value_the_service_would_refuse_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not one of"):
        _ = stack.Arrangement("service", 1, native=value).name


def test_each_compiled_rung_compiles_the_parts_of_the_one_before_and_more() -> None:
    assert set(stack.COMPILED_ADDS) == {*stack.COMPILED_RUNGS, ""}
    compiled = [set() if v == "0" else set(v.split(",")) for v in stack.COMPILED_RUNGS]
    compiled.append(set(native.PARTS))  # the shipped default tops the ladder
    assert compiled[0] == set()
    assert all(a < b for a, b in itertools.pairwise(compiled))


def test_the_serving_line_states_the_implementations(tmp_path: Path) -> None:
    log = tmp_path / "processor.log"
    line = {"message": "serving", "implementation": {"core._scan": "python"}}
    log.write_text("not json\n" + json.dumps({"message": "other"}) + "\n" + json.dumps(line))
    done = subprocess.Popen([sys.executable, "-c", ""])
    done.wait()
    assert stack.served_implementations(log, done, 0.0) == {"core._scan": "python"}
    log.write_text("")
    assert stack.served_implementations(log, done, 0.0) is None
    asked = stack.Arrangement("service", 1, native="core._scan")
    assert asked.expected_implementations() == {
        part: "compiled" if part == "core._scan" else "python" for part in native.PARTS
    }
    assert stack.Arrangement("service", 1).expected_implementations() is None
