"""Header carriers through the real Envoy (ext_proc/tools/carrier_headers.py): every
header of the classification's list (``carrier_headers.ROUTING_HEADERS``: what llm-d, the
Gateway API Inference Extension, NVIDIA Dynamo, Ray and vLLM read for an address, a peer,
a rank or a prompt) and the request id vLLM builds its own from, in every body
arrangement, on every route. What arrived is what the stand-in recorded; the control arm
is the same config without the header step, where every one of them arrives as the
client wrote it. A Lua filter after the step that copies a client's header into a carrier
delivers it, the same filter before the step does not, and check-envoy refuses the first.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ext_proc.core import classified
from ext_proc.tools import carrier_headers, check_envoy
from tests.e2e.conftest import BODY_MODES, ENVOY
from tests.e2e.stack import Received, Stack
from tests.e2e.test_gateway import chat, only_request
from tests.e2e.test_handoff import PREFILL_REQUEST_PARAMS
from tests.e2e.test_operations import access_log


def forged(name: str) -> str:
    """A client's value for the header ``name``, in the shape its name says it holds:
    a URL, addresses for a host and port or an endpoint, a small integer (its own for each
    name) for a rank or an instance id, a port or a room, a UUID for a store key, 1 for a
    framing flag. A name of no known shape
    fails here: its reader's format should be stated before it is forged."""
    if name.endswith("-url"):
        return "http://10.0.0.66:8000"
    if name.endswith("-hosts-ports"):
        return "10.0.0.66:8000,10.0.0.67:8000"
    if name.endswith("-host-port") or "-endpoint" in name:
        return "10.0.0.66:8000"
    if name.endswith(("-rid", "-request-id")):
        return str(uuid.uuid5(uuid.NAMESPACE_URL, name))
    if name.endswith(("-rank", "-id")):
        return str(1 + zlib.crc32(name.encode()) % 9)
    if name.endswith("-key"):
        return str(uuid.uuid5(uuid.NAMESPACE_URL, name))
    if name.endswith(("-room", "-port")):
        return str(1024 + zlib.crc32(name.encode()) % 9)
    if name.endswith("-host"):
        return "10.0.0.66"
    # A framing flag (x-body-compressed, x-sglext-ids-framed).
    if name.endswith(("-compressed", "-framed")):
        return "1"
    # A cache partition's salt (vLLM's coming x-cache-salt): another tenant's.
    if name.endswith("-salt"):
        return "another-tenants-salt"
    raise ValueError(f"{name}: no forged value for a header of this shape")


FORGED = {name: forged(name) for name in carrier_headers.ROUTING_HEADERS}
# vLLM's MoRIIO connector reads the prefill's and the decode's address from this shape.
MORIIO_ID = "a___prefill_addr_10.0.0.66:7000___decode_addr_10.0.0.67:7001_" + "0" * 32
ROUTES = ("/v1/chat/completions", "/pd/v1/chat/completions", "/trusted/v1/chat/completions")
PREFILL = "/pd/prefill/v1/chat/completions"
# The prefill leg as an orchestrator sends it: one token, the prompt's ids asked for.
PREFILL_BODY = {**chat(), "max_tokens": 1, "return_token_ids": True}


def test_the_forged_headers_are_the_ones_the_step_removes():
    assert tuple(FORGED) == carrier_headers.ROUTING_HEADERS


def _sent_headers() -> dict[str, str]:
    return {**FORGED, carrier_headers.REQUEST_ID: MORIIO_ID}


def _arrived(received: Received) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in received.headers:
        out.setdefault(name.lower(), []).append(value)
    return out


def _carriers_that_arrived(arrived: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: arrived[name] for name in FORGED if name in arrived}


@pytest.mark.parametrize("path", ROUTES)
def test_no_client_routing_header_or_request_id_reaches_the_upstream(gateway, path):
    reply = httpx.post(gateway.url + path, json=chat(), headers=_sent_headers(), timeout=20)
    assert reply.status_code == 200, reply.text
    arrived = _arrived(only_request(gateway))
    assert _carriers_that_arrived(arrived) == {}
    (renewed,) = arrived[carrier_headers.REQUEST_ID]
    assert uuid.UUID(renewed).version == 4  # the gateway's own (Envoy's %UNIQUE_ID%)
    assert arrived[carrier_headers.CLIENT_REQUEST_ID] == [MORIIO_ID]


@pytest.mark.parametrize("path", [*ROUTES, PREFILL])
def test_a_clients_cache_salt_header_never_reaches_the_upstream(gateway, path):
    """vLLM PR #57609 (open) reads X-Cache-Salt before the body's cache_salt: a client's
    copy would name any prefix-cache partition it likes. Named, not derived from the list."""
    body = PREFILL_BODY if path == PREFILL else chat(cache_salt="own")
    sent = {"X-Cache-Salt": "another-tenants-salt"}
    reply = httpx.post(gateway.url + path, json=body, headers=sent, timeout=20)
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert "x-cache-salt" not in _arrived(received)
    assert json.loads(received.body).get("cache_salt") == body.get("cache_salt")


# Named, not derived from the list: the prefill host older llm-d routing sidecars read
# (x-prefiller-url), and the KV source its current one reads into remote_host.
NAMED = ("x-prefiller-url", "x-kv-cache-source-host-port")


@pytest.mark.parametrize("path", [*ROUTES, PREFILL])
def test_the_sidecars_prefill_and_kv_source_headers_never_reach_the_upstream(gateway, path):
    sent = {name: "http://10.0.0.66:8000" for name in NAMED}
    body = PREFILL_BODY if path == PREFILL else chat()
    reply = httpx.post(gateway.url + path, json=body, headers=sent, timeout=20)
    assert reply.status_code == 200, reply.text
    arrived = _arrived(only_request(gateway))
    assert [name for name in NAMED if name in arrived] == []
    assert set(NAMED) <= set(classified.HEADER_CARRIERS)


def test_the_prefill_leg_loses_them_too(gateway):
    reply = httpx.post(
        gateway.url + PREFILL, json=PREFILL_BODY, headers=_sent_headers(), timeout=20
    )
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    arrived = _arrived(received)
    assert _carriers_that_arrived(arrived) == {}
    # The prefill server's request id (which its connector returns as remote_request_id
    # in the parameters this route signs) is built from the gateway's id.
    (renewed,) = arrived[carrier_headers.REQUEST_ID]
    assert uuid.UUID(renewed).version == 4
    assert arrived[carrier_headers.CLIENT_REQUEST_ID] == [MORIIO_ID]
    assert json.loads(received.body)["kv_transfer_params"] == PREFILL_REQUEST_PARAMS


def test_a_request_without_an_id_gets_one_and_the_client_none_of_its_own(gateway):
    reply = httpx.post(gateway.url + ROUTES[0], json=chat(), timeout=20)
    assert reply.status_code == 200
    arrived = _arrived(only_request(gateway))
    (renewed,) = arrived[carrier_headers.REQUEST_ID]
    # The id Envoy made for the request moves aside like a client's: both are Envoy's.
    (incoming,) = arrived[carrier_headers.CLIENT_REQUEST_ID]
    assert uuid.UUID(renewed).version == uuid.UUID(incoming).version == 4
    assert renewed != incoming


def test_the_access_log_joins_both_ids(gateway):
    rid = f"join-{uuid.uuid4()}"
    headers = {carrier_headers.REQUEST_ID: rid}
    httpx.post(gateway.url + ROUTES[0], json=chat(), headers=headers, timeout=20)
    arrived = _arrived(only_request(gateway))
    line = access_log(gateway, rid)
    assert line["client_request_id"] == rid
    assert [line["request_id"]] == arrived[carrier_headers.REQUEST_ID]


def test_header_names_with_underscores_never_reach_the_upstream(gateway):
    # A reader that takes "_" for "-" (CGI, WSGI, nginx with underscores_in_headers)
    # would read these as the carriers: Envoy drops them at the listener.
    forged = {name.replace("-", "_"): value for name, value in _sent_headers().items()}
    reply = httpx.post(gateway.url + ROUTES[0], json=chat(), headers=forged, timeout=20)
    assert reply.status_code == 200, reply.text
    arrived = _arrived(only_request(gateway))
    assert not {name for name in arrived if "_" in name}, arrived
    assert arrived[carrier_headers.CLIENT_REQUEST_ID] != [MORIIO_ID]


# --- the control arm: the same configs without the header step ---------------------------


def _without_step(source: Path, target: Path) -> Path:
    config = yaml.safe_load(source.read_text())
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            manager = chain["filters"][0]["typed_config"]
            manager["http_filters"] = [
                f for f in manager["http_filters"] if f["name"] != carrier_headers.FILTER
            ]
    target.write_text(yaml.safe_dump(config))
    return target


@pytest.fixture(scope="module", params=list(BODY_MODES))
def unguarded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp(f"no-header-step-{request.param}")
    source = _without_step(BODY_MODES[request.param], workdir / "source.yaml")
    with Stack(workdir, source=source) as running:
        yield running


@pytest.mark.parametrize("path", [*ROUTES, PREFILL])
def test_without_the_step_every_one_arrives_as_the_client_wrote_it(unguarded, path):
    unguarded.clear()
    body = PREFILL_BODY if path == PREFILL else chat()
    reply = httpx.post(unguarded.url + path, json=body, headers=_sent_headers(), timeout=20)
    assert reply.status_code == 200, reply.text
    arrived = _arrived(only_request(unguarded))
    expected: dict[str, Any] = {name: [value] for name, value in _sent_headers().items()}
    assert {name: arrived.get(name) for name in expected} == expected


# --- a filter after the step that writes a carrier back ------------------------------------
#
# The header step removes every carrier; a Lua filter after it (before the processor's)
# copies a client's header of another name into x-prefiller-host-port, which then reaches
# the upstream as the client wrote it. The same filter before the step writes into a
# header the step then removes. check-envoy refuses the first and passes the second.

LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
EXT_PROC = "envoy.filters.http.ext_proc"
SHIPPED = ENVOY / "envoy.yaml"
COPIED = "x-prefiller-host-port"
# The client's own header the script reads: no carrier, so the step lets it through.
SOURCE = "x-mine"
COPY_SCRIPT = (
    "function envoy_on_request(h) "
    f"local v = h:headers():get('{SOURCE}') "
    f"if v then h:headers():replace('{COPIED}', v) end end"
)


def _copy_filter(before: str) -> Callable[[dict[str, Any]], None]:
    """An edit: the copying Lua filter right before the filter named ``before``."""

    def change(config: dict[str, Any]) -> None:
        for manager in _managers(config):
            filters = manager["http_filters"]
            at = [f["name"] for f in filters].index(before)
            script = {"inline_string": COPY_SCRIPT}
            filters.insert(
                at, {"name": "copy", "typed_config": {"@type": LUA, "default_source_code": script}}
            )

    return change


def _managers(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            yield chain["filters"][0]["typed_config"]


COPIES = {"after-the-step": EXT_PROC, "before-the-step": carrier_headers.FILTER}


@pytest.fixture(scope="module", params=list(COPIES))
def copying(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Stack]]:
    workdir = tmp_path_factory.mktemp(f"copy-{request.param}")
    with Stack(workdir, edit=_copy_filter(COPIES[request.param])) as running:
        yield request.param, running


def test_a_carrier_a_filter_after_the_step_copies_reaches_the_upstream(copying):
    where, stack = copying
    stack.clear()
    forged = FORGED[COPIED]
    reply = httpx.post(stack.url + ROUTES[0], json=chat(), headers={SOURCE: forged}, timeout=20)
    assert reply.status_code == 200, reply.text
    arrived = _carriers_that_arrived(_arrived(only_request(stack)))
    assert arrived == ({COPIED: [forged]} if where == "after-the-step" else {})


@pytest.mark.parametrize("where", list(COPIES))
def test_check_envoy_refuses_the_copy_after_the_step_only(where):
    config = yaml.safe_load(SHIPPED.read_text())
    _copy_filter(COPIES[where])(config)
    report = check_envoy.check(config)
    expected = ["router-header-writer", "header-rewritten-by-filter"]
    assert report.codes() == (expected if where == "after-the-step" else [])
