"""The Envoy config generator: input validation names fields; output is envoy/envoy.yaml."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc import envoygen, route_policy
from ext_proc.attributes import attribute_keys
from ext_proc.route_policy import Action, Topology
from ext_proc.server import SERVICE_NAME
from tests.filters import assert_fails_closed

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "deploy" / "envoy-config.example.yaml"
EXT_PROC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def generate(data: dict[str, Any]) -> dict[str, Any]:
    return envoygen.to_dict(envoygen.build(envoygen.load_input(data)))


def hcm_of(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    (network_filter,) = chain["filters"]
    return network_filter["typed_config"]


def ext_proc_of(config: dict[str, Any]) -> dict[str, Any]:
    filters = hcm_of(config)["http_filters"]
    assert [f["name"] for f in filters] == [envoygen.EXT_PROC_FILTER, envoygen.ROUTER_FILTER]
    return filters[0]["typed_config"]


def clusters_of(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in config["static_resources"]["clusters"]}


def normalized(path: Path) -> dict[str, Any]:
    """A hand-written Envoy config read through the same typed model."""
    return envoygen.to_dict(
        envoygen.bootstrap.Bootstrap.from_dict(yaml.safe_load(path.read_text()))
    )


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{where}/{key}: only in {'generated' if key in a else 'shipped'}")
            else:
                out += differences(a[key], b[key], f"{where}/{key}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)} items"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{where}[{i}]")
        ]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.parametrize(
    ("body_mode", "shipped"), [("buffered", "envoy.yaml"), ("streamed", "envoy-streamed.yaml")]
)
def test_example_reproduces_the_shipped_config(body_mode, shipped):
    data = example()
    data["body_mode"] = body_mode
    diff = differences(generate(data), normalized(REPO / "envoy" / shipped))
    assert diff == [], "generator and envoy/" + shipped + " differ:\n" + "\n".join(diff)


def test_fail_closed_filter():
    config = generate(example())
    filt = ext_proc_of(config)
    assert_fails_closed(filt)
    assert filt["grpc_service"]["envoy_grpc"]["cluster_name"] == envoygen.PROCESSOR_CLUSTER


def test_streamed_mode():
    data = example() | {"body_mode": "streamed"}
    filt = ext_proc_of(generate(data))
    assert filt["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert filt["failure_mode_allow"] is False


def test_namespace_follows_input():
    data = example() | {"namespace": "acme.policy"}
    config = generate(data)
    assert ext_proc_of(config)["request_attributes"] == list(attribute_keys("acme.policy").all())
    for entry in hcm_of(config)["route_config"]["virtual_hosts"][0]["routes"]:
        assert list(entry["metadata"]["filter_metadata"]) == ["acme.policy"]


def test_routes_carry_policy_and_body_limit():
    data = example()
    data["routes"][1]["body_limit_bytes"] = 1024
    config = generate(data)
    (vhost,) = hcm_of(config)["route_config"]["virtual_hosts"]
    by_name = {r["name"]: r for r in vhost["routes"]}
    assert list(by_name) == ["disaggregated", "aggregated", "default"]
    pd = by_name["disaggregated"]
    assert pd["match"] == {"prefix": "/pd/v1/"}
    assert pd["route"]["prefix_rewrite"] == "/v1/"
    assert pd["request_body_buffer_limit"] == 16 * 1024 * 1024
    assert by_name["aggregated"]["request_body_buffer_limit"] == 1024
    assert "prefix_rewrite" not in by_name["aggregated"]["route"]
    # What the processor reads back, field by field, the way CEL renders values.
    for entry, expected in (
        (pd, route_policy.RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, None, 131072)),
        (by_name["aggregated"], route_policy.RoutePolicy(Topology.AGGREGATED, Action.STRIP)),
    ):
        fields = entry["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        assert isinstance(fields.get("max_ids", 1), int)  # written 131072, not 131072.0
        values = {k: v if isinstance(v, bool) else str(v) for k, v in fields.items()}
        assert route_policy.parse(values, float(len(fields))) == expected


def test_clusters():
    config = generate(example())
    clusters = clusters_of(config)
    assert list(clusters) == ["ext_proc", "aggregated", "disaggregated"]
    processor = clusters["ext_proc"]
    assert processor["type"] == "STATIC"
    options = processor["typed_extension_protocol_options"][envoygen.HTTP_OPTIONS]
    h2 = options["explicit_http_config"]["http2_protocol_options"]
    assert h2 == {
        "initial_stream_window_size": 32 * 1024 * 1024,
        "initial_connection_window_size": 64 * 1024 * 1024,
    }
    (check,) = processor["health_checks"]
    assert check["grpc_health_check"]["service_name"] == envoygen.PROCESSOR_SERVICE
    assert clusters["aggregated"]["type"] == "STRICT_DNS"


def test_processor_service_name_matches_the_server():
    assert envoygen.PROCESSOR_SERVICE == SERVICE_NAME


def test_dns_processor_gets_strict_dns():
    data = example() | {"processor": "ext-proc-token-policy-headless.llm-d.svc.cluster.local:50051"}
    processor = clusters_of(generate(data))["ext_proc"]
    assert processor["type"] == "STRICT_DNS"
    endpoint = processor["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {
        "address": "ext-proc-token-policy-headless.llm-d.svc.cluster.local",
        "port_value": 50051,
    }


def test_local_replies_keep_processor_denials():
    mappers = hcm_of(generate(example()))["local_reply_config"]["mappers"]
    assert len(mappers) == 4
    for mapper in mappers:
        text = json.dumps(mapper["filter"])
        assert "!response.code_details.startsWith('token_policy_')" in text
        assert mapper["body_format_override"]["content_type"] == "application/json"
        assert set(mapper["body_format_override"]["json_format"]["error"]) == {
            "message",
            "type",
            "param",
            "code",
        }


def test_policy_input_follows_route_policy_fields():
    assert set(envoygen.PolicyInput.model_fields) == set(route_policy.FIELDS)


def test_policy_metadata_writes_only_given_fields():
    policy = envoygen.PolicyInput.model_validate({"topology": "disaggregated", "vocab_size": 7})
    assert policy.metadata() == {"topology": "disaggregated", "vocab_size": 7}


def mutate(change) -> dict[str, Any]:
    data = copy.deepcopy(example())
    change(data)
    return data


def _set(path: str, value: Any):
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return change


INVALID = [
    (_set("listener_prot", 1), "listener_prot: Extra inputs are not permitted"),
    (_set("listener_port", 70000), "listener_port:"),
    (_set("listener_address", "localhost"), "listener_address:"),
    (_set("processor", "nohost"), "processor:"),
    (_set("processor", "ext-proc:0"), "processor:"),
    (_set("body_mode", "chunked"), "body_mode:"),
    (_set("message_timeout_seconds", 0), "message_timeout_seconds:"),
    (_set("upstreams.ext_proc", "127.0.0.1:1"), "reserved for the processor"),
    (_set("upstreams.aggregated", "127.0.0.1"), "upstream 'aggregated'"),
    (_set("routes", []), "routes:"),
    (_set("routes.1.upstream", "agregated"), "routes.1.upstream: 'agregated' is not one of"),
    (_set("routes.0.prefix", "pd/v1/"), "routes.0.prefix:"),
    (_set("routes.2.prefix", "/v1/"), "routes.2.prefix: '/v1/' is matched by an earlier route"),
    (_set("routes.2.name", "aggregated"), "routes.2.name: 'aggregated' is used by an earlier"),
    (_set("routes.1.policy.action", "allow"), "routes.1.policy.action:"),
    (_set("routes.1.policy.topolgy", "aggregated"), "routes.1.policy.topolgy: Extra inputs"),
    (_set("routes.0.policy.vocab_size", 0), "routes.0.policy.vocab_size:"),
    (_set("routes.0.policy.max_ids", "many"), "routes.0.policy.max_ids:"),
    (_set("routes.1.body_limit_bytes", -1), "routes.1.body_limit_bytes:"),
]


@pytest.mark.parametrize(("change", "message"), INVALID)
def test_invalid_input_names_the_field(change, message):
    with pytest.raises(envoygen.GeneratorError) as caught:
        envoygen.load_input(mutate(change))
    assert message in str(caught.value)


def test_input_must_be_a_mapping():
    with pytest.raises(envoygen.GeneratorError, match="must be a mapping"):
        envoygen.load_input(["not", "a", "mapping"])


def test_route_names_default_to_upstream_and_index():
    data = example()
    for entry in data["routes"]:
        del entry["name"]
    (vhost,) = hcm_of(generate(data))["route_config"]["virtual_hosts"]
    assert [r["name"] for r in vhost["routes"]] == [
        "disaggregated-0",
        "aggregated-1",
        "aggregated-2",
    ]


def test_cli_writes_a_file(tmp_path, capsys):
    out = tmp_path / "envoy.yaml"
    assert envoygen.main([str(EXAMPLE), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Generated by `python -m ext_proc envoy-config`")
    assert yaml.safe_load(text) == generate(example())
    assert capsys.readouterr().out == ""


def test_cli_writes_stdout(capsys):
    assert envoygen.main([str(EXAMPLE)]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == generate(example())


def test_cli_reports_invalid_input(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(mutate(_set("routes.1.upstream", "nowhere"))))
    assert envoygen.main([str(bad), "-o", str(tmp_path / "out.yaml")]) == 2
    err = capsys.readouterr().err
    assert "routes.1.upstream" in err
    assert not (tmp_path / "out.yaml").exists()


def test_cli_reports_unreadable_input(tmp_path, capsys):
    assert envoygen.main([str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
