"""llm-d's routing-sidecar architecture through two real pod-local Envoys
(deploy/llm-d/routing-sidecar/): the prefill pod's (envoy/envoy-pod-prefill.yaml, mint)
and the decode pod's (envoy/envoy-pod-decode.yaml, honor), each with its own processor,
the two sharing one proof key, the recording stand-in as both vLLMs and the sidecar's
emulation (tests/e2e/sidecar.py) in front of the decode pod's Envoy.

Neither leg crosses a gateway: what the decode pod's vLLM honors rests on the proof the
prefill pod's Envoy signed, not on who sent it."""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack import envoy_config, processes, tokens
from ext_proc.core.address import HostPort
from ext_proc.tools import carrier_headers
from ext_proc.tools.carrier_headers import CLIENT_REQUEST_ID
from tests.e2e.sidecar import CONNECTOR_REQUEST, PREFILL_HEADER, REQUEST_ID, RoutingSidecar
from tests.e2e.stack import LOCAL, Stack, new_key, start_stand_in
from tests.e2e.test_gateway import chat
from tests.e2e.test_operations import access_log, decision_logs

ENVOY = envoy_config.REPO / "envoy"
KEY_ID = "pods"
CHAT = "/v1/chat/completions"


def _port() -> HostPort:
    return HostPort(LOCAL, processes.free_port())


class Pod:
    """One model-server pod: its Envoy and processor (a ``Stack`` with the pod's config,
    nothing added) and its vLLM (the stack's stand-in, the config's ``vllm`` cluster)."""

    def __init__(self, name: str, workdir: Path, source: Path, key: bytes) -> None:
        folder = workdir / name
        folder.mkdir()
        self.stack = Stack(folder, source=source, routes=[], proof_keys={KEY_ID: key})
        self.stack.others = {"vllm": self.stack.upstream}

    @property
    def listener(self) -> HostPort:
        return self.stack.gateway

    def start(self) -> None:
        self.stack.start()

    def stop(self) -> None:
        self.stack.stop()

    def received(self) -> list[tuple[str, dict[str, list[str]], dict[str, Any]]]:
        """What reached this pod's vLLM: path, headers (lower-case names), body."""
        out = []
        for r in self.stack.received():
            headers: dict[str, list[str]] = {}
            for name, value in r.headers:
                headers.setdefault(name.lower(), []).append(value)
            out.append((r.target, headers, json.loads(r.body)))
        return out

    def clear(self) -> None:
        self.stack.clear()

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://{self.stack.metrics}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample.startswith(name + "{"):
                found = dict(
                    part.split("=", 1) for part in sample[len(name) + 1 : -1].split(",") if part
                )
                if {k: v.strip('"') for k, v in found.items()} == labels:
                    return float(value)
        return 0.0

    def access_log(self, request_id: str) -> dict[str, Any]:
        found: dict[str, Any] = access_log(self.stack, request_id)
        return found

    def decision(self, request_id: str) -> dict[str, Any]:
        (found,) = [
            d
            for d in decision_logs(self.stack, {request_id})
            if d["client_request_id"] == request_id
        ]
        return found


@dataclass
class Pods:
    prefill: Pod
    decode: Pod
    sidecar: RoutingSidecar

    def clear(self) -> None:
        self.prefill.clear()
        self.decode.clear()


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    workdir = tmp_path_factory.mktemp("routing-sidecar")
    key = new_key()  # the Secret ext-proc-proof-keys every pod mounts
    prefill = Pod("prefill", workdir, ENVOY / "envoy-pod-prefill.yaml", key)
    decode = Pod("decode", workdir, ENVOY / "envoy-pod-decode.yaml", key)
    try:
        prefill.start()
        decode.start()
        # The sidecar's decoder: http://localhost:<--model-server-port>, the decode Envoy.
        with RoutingSidecar(_port(), f"http://{decode.listener}") as sidecar:
            yield Pods(prefill, decode, sidecar)
    finally:
        decode.stop()
        prefill.stop()


@pytest.fixture
def cluster(pods: Pods) -> Iterator[Pods]:
    pods.clear()
    pods.sidecar.tamper = None
    yield pods
    pods.sidecar.tamper = None


def through_sidecar(
    pods: Pods, body: dict[str, Any], *, prefill: bool = True, rid: str | None = None
) -> httpx.Response:
    """The gateway's request to the decode pod: the EPP's header names the prefill pod."""
    headers = {PREFILL_HEADER: str(pods.prefill.listener)} if prefill else {}
    if rid is not None:
        headers[REQUEST_ID] = rid
    reply = httpx.post(pods.sidecar.url + CHAT, json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply


def without_params(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "kv_transfer_params"}


def proven(leg: dict[str, Any]) -> dict[str, Any]:
    """A decode leg's kv_transfer_params without their proof, which the decode pod's
    gateway forwarded with them (docs/trust.md)."""
    params = dict(leg["kv_transfer_params"])
    assert params.pop("token_policy_proof").startswith("tp4.")
    return params


def only(pod: Pod) -> tuple[str, dict[str, list[str]], dict[str, Any]]:
    (received,) = pod.received()
    assert received[0] == CHAT
    return received


# --- (a) the proven hand-off --------------------------------------------------------------


def test_the_proven_hand_off_is_honored(cluster):
    minted_before = cluster.prefill.metric(
        "ext_proc_decisions_total", route="prefill", action="mint", reason="minted", mode="enforce"
    )
    honored_before = cluster.decode.metric(
        "ext_proc_decisions_total",
        route="disaggregated",
        action="honor",
        reason="trusted_proof",
        mode="enforce",
    )
    sent = chat(max_tokens=64)
    through_sidecar(cluster, sent)

    # The prefill leg, as the sidecar wrote it: its connector request, one token.
    _path, prefill_headers, prefill_leg = only(cluster.prefill)
    assert prefill_leg["kv_transfer_params"] == CONNECTOR_REQUEST
    assert (prefill_leg["max_tokens"], prefill_leg["stream"]) == (1, False)
    # The sidecar's request id reaches vLLM as the one the request came with; each pod's
    # Envoy gives the request its own (the header step).
    (rid,) = prefill_headers[CLIENT_REQUEST_ID]
    assert prefill_headers[REQUEST_ID] != [rid]

    # The decode leg: the prefill server's connector keys with their proof, the
    # client's request otherwise as sent.
    _path, decode_headers, decode_leg = only(cluster.decode)
    assert decode_headers[CLIENT_REQUEST_ID] == [rid]
    assert proven(decode_leg) == tokens.CONNECTOR_REPLY
    assert without_params(decode_leg) == sent

    # What each pod's processor decided, in the access log, its own log and its metrics.
    prefill_line = cluster.prefill.access_log(rid)
    assert prefill_line["policy_response_action"] == "mint", prefill_line
    assert prefill_line["policy_response_reason"] == "minted", prefill_line
    decode_line = cluster.decode.access_log(rid)
    assert (decode_line["policy_action"], decode_line["policy_reason"]) == (
        "honor",
        "trusted_proof",
    ), decode_line
    decision = cluster.decode.decision(rid)
    assert (decision["action"], decision["reason"]) == ("honor", "trusted_proof"), decision
    assert cluster.prefill.metric(
        "ext_proc_decisions_total", route="prefill", action="mint", reason="minted", mode="enforce"
    ) == (minted_before + 1)
    assert cluster.decode.metric(
        "ext_proc_decisions_total",
        route="disaggregated",
        action="honor",
        reason="trusted_proof",
        mode="enforce",
    ) == (honored_before + 1)


# --- (b) the decoder-only path ------------------------------------------------------------


def test_a_clients_parameters_on_the_decoder_only_path_are_removed(cluster):
    # Without x-prefiller-host-port the sidecar forwards the client's body unchanged.
    evil = {**tokens.CONNECTOR_REPLY, "remote_host": "10.0.0.7", "prompt_token_ids": [1, 2, 3]}
    sent = chat(evil)
    rid = f"decoder-only-{time.monotonic_ns()}"
    through_sidecar(cluster, sent, prefill=False, rid=rid)
    assert cluster.prefill.received() == []
    _path, headers, decode_leg = only(cluster.decode)
    assert headers[CLIENT_REQUEST_ID] == [rid]  # the sidecar adds none on this path
    assert "kv_transfer_params" not in decode_leg
    assert decode_leg == without_params(sent)
    line = cluster.decode.access_log(rid)
    assert (line["policy_action"], line["policy_reason"]) == ("strip", "proof_missing"), line
    decision = cluster.decode.decision(rid)
    assert (decision["action"], decision["reason"]) == ("strip", "proof_missing"), decision


# --- (c) a sidecar that edits the parameters ---------------------------------------------


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda params: {**params, key: value}


@pytest.mark.parametrize(
    "tamper",
    [
        _set("remote_host", "10.0.0.9"),
        _set("remote_port", 22),
        _set("remote_block_ids", [[1, 2, 3, 4]]),
    ],
    ids=["remote_host", "remote_port", "remote_block_ids"],
)
def test_parameters_a_sidecar_edited_are_not_honored(cluster, tamper):
    cluster.sidecar.tamper = tamper
    sent = chat(max_tokens=64)
    through_sidecar(cluster, sent)
    (_path, prefill_headers, _leg) = only(cluster.prefill)
    (rid,) = prefill_headers[CLIENT_REQUEST_ID]
    _path, _headers, decode_leg = only(cluster.decode)
    assert "kv_transfer_params" not in decode_leg
    assert decode_leg == sent
    line = cluster.decode.access_log(rid)
    assert (line["policy_action"], line["policy_reason"]) == ("strip", "proof_bad_signature")


# --- (d) a caller's parameters on the prefill leg ----------------------------------------


EVIL_PREFILL = {
    **CONNECTOR_REQUEST,
    "remote_host": "10.0.0.7",
    "remote_port": 22,
    "remote_block_ids": [[9]],
    "prompt_token_ids": [1, 2, 3],
}


def test_a_callers_parameters_never_reach_the_prefill_server(cluster):
    # Anything the NetworkPolicy admits to the prefill pod's port can call it directly;
    # the route writes its own connector request instead of the caller's.
    sent = chat(EVIL_PREFILL, max_tokens=1)
    reply = httpx.post(f"http://{cluster.prefill.listener}{CHAT}", json=sent, timeout=30)
    assert reply.status_code == 200, reply.text
    _path, _headers, prefill_leg = only(cluster.prefill)
    assert prefill_leg["kv_transfer_params"] == CONNECTOR_REQUEST
    assert without_params(prefill_leg) == without_params(sent)
    assert "token_policy_proof" in reply.json()["kv_transfer_params"]


def test_a_clients_parameters_through_the_sidecar_never_reach_the_prefill_server(cluster):
    sent = chat(EVIL_PREFILL, max_tokens=64)
    through_sidecar(cluster, sent)
    _path, _headers, prefill_leg = only(cluster.prefill)
    assert prefill_leg["kv_transfer_params"] == CONNECTOR_REQUEST
    # The decode leg carries what the prefill server answered, never the client's.
    _path, _headers, decode_leg = only(cluster.decode)
    assert proven(decode_leg) == tokens.CONNECTOR_REPLY


# --- (e) the gateway in front of the sidecar: client routing headers ----------------------

# The endpoint picker's stand-in: a header filter after this processor's filter and its
# hold, which writes x-prefiller-host-port on the route where it "picks" P/D and nothing
# where it picks decode-only, as llm-d's EPP does (set-header mutations only).
EPP_FILTER = "epp"
EPP_PREFIX = "/epp-pd/"


def _epp_after_this_filter(prefill: HostPort) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        listener = config["static_resources"]["listeners"][0]
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        filters = manager["http_filters"]
        filters.insert(
            len(filters) - 1,  # before the router, after ours and the hold
            {
                "name": EPP_FILTER,
                "typed_config": {"@type": carrier_headers.FILTER_TYPE},
            },
        )
        (vhost,) = manager["route_config"]["virtual_hosts"]
        (aggregated,) = [r for r in vhost["routes"] if r.get("name") == "aggregated"]
        picked = copy.deepcopy(aggregated)
        picked["name"] = "epp-pd"
        picked["match"] = {"prefix": EPP_PREFIX}
        picked["route"]["prefix_rewrite"] = "/"
        picked["typed_per_filter_config"][EPP_FILTER] = {
            "@type": HEADER_MUTATION_PER_ROUTE,
            "mutations": {
                "request_mutations": [
                    {
                        "append": {
                            "header": {"key": PREFILL_HEADER, "value": str(prefill)},
                            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                        }
                    }
                ]
            },
        }
        vhost["routes"].insert(vhost["routes"].index(aggregated), picked)

    return edit


HEADER_MUTATION_PER_ROUTE = (
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute"
)


@dataclass
class Fronted:
    pods: Pods
    gateway: Stack
    rogue: Stack  # the pod a client's header points at


@pytest.fixture(scope="module")
def fronted(pods: Pods, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronted]:
    workdir = tmp_path_factory.mktemp("gateway-before-sidecar")
    (workdir / "gateway").mkdir()
    # Only the recording stand-in of this one: a pod that answers and tells what it got.
    rogue = Stack(workdir, routes=[])
    rogue.children["upstream"] = start_stand_in(rogue.upstream, workdir / "rogue.log")
    gateway = Stack(
        workdir / "gateway",
        routes=[],
        real_upstream=pods.sidecar.listen,
        edit=_epp_after_this_filter(pods.prefill.listener),
    )
    try:
        with gateway:
            yield Fronted(pods, gateway, rogue)
    finally:
        rogue.stop()


def test_a_clients_prefill_header_on_a_decode_only_pick_never_reaches_the_sidecar(fronted):
    cluster = fronted.pods
    cluster.clear()
    fronted.rogue.clear()
    sent = chat(max_tokens=16)
    forged = {PREFILL_HEADER: str(fronted.rogue.upstream)}
    reply = httpx.post(fronted.gateway.url + CHAT, json=sent, headers=forged, timeout=30)
    assert reply.status_code == 200, reply.text
    # Decode only: the sidecar sent no prefill leg anywhere, the client's pod least.
    assert fronted.rogue.received() == []
    assert cluster.prefill.received() == []
    _path, headers, decode_leg = only(cluster.decode)
    assert PREFILL_HEADER not in headers
    assert decode_leg == sent


def test_the_pickers_own_header_still_reaches_the_sidecar(fronted):
    cluster = fronted.pods
    cluster.clear()
    fronted.rogue.clear()
    sent = chat(max_tokens=16)
    forged = {PREFILL_HEADER: str(fronted.rogue.upstream)}
    url = fronted.gateway.url + EPP_PREFIX.rstrip("/") + CHAT
    reply = httpx.post(url, json=sent, headers=forged, timeout=30)
    assert reply.status_code == 200, reply.text
    # The picker's choice, set after this filter, is the one the sidecar called.
    assert fronted.rogue.received() == []
    _path, _headers, prefill_leg = only(cluster.prefill)
    assert prefill_leg["kv_transfer_params"] == CONNECTOR_REQUEST
    _path, _headers, decode_leg = only(cluster.decode)
    assert proven(decode_leg) == tokens.CONNECTOR_REPLY
    assert without_params(decode_leg) == sent


def _without_header_step(
    edit: Callable[[dict[str, Any]], None],
) -> Callable[[dict[str, Any]], None]:
    def changed(config: dict[str, Any]) -> None:
        edit(config)
        manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        filters = manager["typed_config"]["http_filters"]
        filters[:] = [f for f in filters if f["name"] != carrier_headers.FILTER]

    return changed


def test_without_the_header_step_the_client_picks_the_prefill_pod(fronted, tmp_path):
    # The control arm: the same gateway without the header step forwards the client's
    # header, and the sidecar sends the prefill leg (the NIXL read) where it points.
    cluster = fronted.pods
    cluster.clear()
    fronted.rogue.clear()
    edit = _without_header_step(_epp_after_this_filter(cluster.prefill.listener))
    with Stack(tmp_path, routes=[], real_upstream=cluster.sidecar.listen, edit=edit) as bare:
        forged = {PREFILL_HEADER: str(fronted.rogue.upstream)}
        httpx.post(bare.url + CHAT, json=chat(max_tokens=16), headers=forged, timeout=30)
    (leg,) = fronted.rogue.received()
    assert json.loads(leg.body)["kv_transfer_params"] == CONNECTOR_REQUEST
    assert cluster.prefill.received() == []
