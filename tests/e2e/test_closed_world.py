"""What check-envoy does not read is refused, on the real Envoy: three shapes that
``envoy --mode validate`` accepts and the check passed while they undid a decision.

- A decided route whose cluster a client's header names, beside clusters from CDS: the
  shipped config, a CDS cluster (a file source) whose ``HttpProtocolOptions`` retry,
  and the honor route's ``cluster: disaggregated`` replaced by ``cluster_header``. A
  client naming the CDS cluster gets its proven body to the upstream twice; naming the
  static cluster, once.
- A filter chain the check did not read beside the checked one: ``http_inspector``
  picks the HTTP chain by ALPN (``http/1.1``, ``h2c``), and a ``default_filter_chain``
  proxies the rest over TCP to the decode cluster. An HTTP/1.0 request is neither:
  its forged ``kv_transfer_params`` reach the upstream verbatim, on the path the client
  chose.
- An ``ExtProcPerRoute`` override sending the honor route's requests to another
  processor (a canary with its own record would honor a proof this one spent).

The stand-in upstream answers 200 to everything; the CDS cluster retries on 200
(``retriable_status_codes``), the mechanism a 503 would trigger, made certain."""

from __future__ import annotations

import copy
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.tools import check_envoy
from ext_proc.tools.check_envoy.envoy_validate import find_envoy, validate
from tests.e2e.conftest import ENVOY, KEY_ID
from tests.e2e.stack import Received, Stack, new_key
from tests.e2e.test_decided_once import proven_decode
from tests.e2e.test_gateway import chat
from tests.e2e.test_handoff import DECODE, UPSTREAM_PATH

SHIPPED = ENVOY / "envoy.yaml"
OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
POOL_HEADER = "x-decode-pool"
RETRYING = "decode-pool"
CANARY = "canary"
FORGED = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "forged",
    "remote_block_ids": [1, 2, 3],
    "remote_host": "10.0.0.66",
    "remote_port": 5600,
}


def _listener(config: dict[str, Any]) -> dict[str, Any]:
    listener: dict[str, Any] = config["static_resources"]["listeners"][0]
    return listener


def _cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return cluster


def _honor_route(config: dict[str, Any]) -> dict[str, Any]:
    manager = _listener(config)["filter_chains"][0]["filters"][0]["typed_config"]
    (vhost,) = manager["route_config"]["virtual_hosts"]
    (route,) = [r for r in vhost["routes"] if r.get("name") == "disaggregated"]
    return route


def cluster_from_header_beside_cds(cds: Path) -> Any:
    """The audit's first edit, the CDS cluster written to ``cds`` (a file source)."""

    def edit(config: dict[str, Any]) -> None:
        retrying = copy.deepcopy(_cluster(config, "disaggregated"))
        retrying["name"] = retrying["load_assignment"]["cluster_name"] = RETRYING
        retrying["typed_extension_protocol_options"] = {
            OPTIONS: {
                "@type": f"type.googleapis.com/{OPTIONS}",
                "explicit_http_config": {"http_protocol_options": {}},
                "retry_policy": {
                    "retry_on": "retriable-status-codes",
                    "retriable_status_codes": [200],
                    "num_retries": 1,
                },
            }
        }
        cluster_type = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        cds.write_text(yaml.safe_dump({"resources": [{"@type": cluster_type, **retrying}]}))
        config["node"] = {"id": "gateway", "cluster": "gateway"}
        config["dynamic_resources"] = {
            "cds_config": {"resource_api_version": "V3", "path_config_source": {"path": str(cds)}}
        }
        action = _honor_route(config)["route"]
        del action["cluster"]
        action["cluster_header"] = POOL_HEADER

    return edit


def tcp_proxy_beside_http_inspector(config: dict[str, Any]) -> None:
    """The audit's second edit."""
    listener = _listener(config)
    listener["listener_filters"] = [
        {
            "name": "envoy.filters.listener.http_inspector",
            "typed_config": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector"
            },
        }
    ]
    listener["filter_chains"][0]["filter_chain_match"] = {
        "application_protocols": ["http/1.1", "h2c"]
    }
    listener["default_filter_chain"] = {
        "filters": [
            {
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/"
                    "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "raw",
                    "cluster": "disaggregated",
                },
            }
        ]
    }


def honor_served_by_a_canary(config: dict[str, Any]) -> None:
    """The audit's third edit: the honor route's requests go to another processor."""
    canary = copy.deepcopy(_cluster(config, "ext_proc"))
    canary["name"] = canary["load_assignment"]["cluster_name"] = CANARY
    config["static_resources"]["clusters"].append(canary)
    per_route = _honor_route(config).setdefault("typed_per_filter_config", {})
    per_route["envoy.filters.http.ext_proc"] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
        "overrides": {"grpc_service": {"envoy_grpc": {"cluster_name": CANARY}}},
    }


EDITS = {
    "cluster-from-header-beside-cds": (None, "decided-cluster-chosen"),
    "tcp-proxy-beside-http-inspector": (tcp_proxy_beside_http_inspector, "filter-chain-unchecked"),
    "override-to-a-canary": (honor_served_by_a_canary, "override-grpc-service"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_check_envoy_refuses_what_envoy_accepts(name, tmp_path):
    edit, code = EDITS[name]
    config = yaml.safe_load(SHIPPED.read_text())
    (edit or cluster_from_header_beside_cds(tmp_path / "cds.yaml"))(config)
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    envoy = find_envoy()
    assert envoy is not None
    assert validate(path, envoy) is None
    assert code in check_envoy.check(config).codes("error")


@pytest.fixture(scope="module")
def edited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack with the first two edits (each leaves the other's requests alone)."""
    workdir = tmp_path_factory.mktemp("closed-world")
    from_header = cluster_from_header_beside_cds(workdir / "cds.yaml")

    def edit(config: dict[str, Any]) -> None:
        from_header(config)
        tcp_proxy_beside_http_inspector(config)

    with Stack(workdir, proof_keys={KEY_ID: new_key()}, edit=edit) as running:
        yield running


def _refused_by_check_envoy(stack: Stack, code: str) -> None:
    # The harm below comes from a configuration the check refuses.
    shipped = yaml.safe_load(SHIPPED.read_text())
    cluster_from_header_beside_cds(stack.workdir / "cds-checked.yaml")(shipped)
    tcp_proxy_beside_http_inspector(shipped)
    assert code in check_envoy.check(shipped).codes("error")


def _received(stack: Stack, expected: int) -> list[Received]:
    # A retry follows the answered request: wait for it a little, then for anything more.
    deadline = time.monotonic() + 3
    while stack.received_count() < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    return stack.received()


@pytest.mark.parametrize(("pool", "copies"), [("disaggregated", 1), (RETRYING, 2)])
def test_a_client_naming_a_cds_cluster_gets_a_proven_body_delivered_twice(edited, pool, copies):
    _refused_by_check_envoy(edited, "decided-cluster-chosen")
    reply, raw = proven_decode(edited, {POOL_HEADER: pool})
    assert reply.status_code == 200, reply.text
    received = _received(edited, copies)
    assert [(r.target, r.body) for r in received] == [(UPSTREAM_PATH, raw)] * copies


def _http_1_0(stack: Stack, body: bytes) -> bytes:
    head = (
        f"POST {DECODE} HTTP/1.0\r\nhost: gateway\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((stack.gateway.host, stack.gateway.port), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_an_http_1_0_request_takes_the_default_chain_uninspected(edited):
    _refused_by_check_envoy(edited, "filter-chain-unchecked")
    edited.clear()
    forged = json.dumps(chat(FORGED)).encode()
    answer = _http_1_0(edited, forged)
    assert answer.startswith(b"HTTP/1."), answer[:200]
    received = _received(edited, 1)
    # The client's path and its forged ids, verbatim: no route, no processor.
    assert [(r.target, r.body) for r in received] == [(DECODE, forged)]
