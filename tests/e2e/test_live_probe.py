"""The live probe: check-envoy's claims about vLLM's token-in and echo endpoints,
confirmed on the real Envoy, so that the static check is itself checked against Envoy.

For every shipped config, every probe path check-envoy makes (``route_probes``) is sent
through the real Envoy, in front of the recording stand-in upstream, with no processor
(``envoy_alone``). The check claims, per probe, either an answer (a direct response's
status, or Envoy's own 404 when no route matches) or a forward to an upstream path.
Envoy must agree: an answered probe gets that status and nothing reaches the upstream; a
forwarded one reaches the upstream at exactly the path the check computed, unless the
processor's filter asks first (a request with headers sent to the processor) and, with
no processor there, fails closed with a 500. Requests are body-less GETs, so a route
that runs the filter with one message per request forwards them without asking it.

The shipped configs forward no probe. The same run on configs edited to forward them
(the regexes of the audit's edits in tests/tools/check_envoy/, the echo 404 removed) shows the
check's forwards happen on Envoy too, at the upstream paths it computed.
"""

from __future__ import annotations

import copy
import http.client
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.tools import route_probes
from ext_proc.tools.token_endpoints import is_token_path
from tests.e2e import certs
from tests.e2e.envoy_alone import REPO, Gateway, running

SHIPPED = sorted((REPO / "envoy").glob("*.yaml"))
# Fail closed: the filter could not reach the processor.
FAILED_CLOSED = 500


def routes_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The routes of the one virtual host every shipped config has (domains "*")."""
    (listener,) = config["static_resources"]["listeners"]
    chains = listener.get("filter_chains") or [listener["default_filter_chain"]]
    (manager,) = chains[0]["filters"]
    (vhost,) = manager["typed_config"]["route_config"]["virtual_hosts"]
    assert vhost["domains"] == ["*"]
    routes: list[dict[str, Any]] = vhost["routes"]
    return routes


def tls_client(config: dict[str, Any], cert_dir: Path) -> ssl.SSLContext | None:
    """For a listener that asks clients for a certificate: the orchestrator's."""
    (listener,) = config["static_resources"]["listeners"]
    chains = listener.get("filter_chains") or [listener["default_filter_chain"]]
    if "transport_socket" not in chains[0]:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cert_dir / "ca.crt")
    context.check_hostname = False  # the gateway's certificate names gateway.local
    context.load_cert_chain(cert_dir / "router.crt", cert_dir / "router.key")
    return context


class Client:
    """One keep-alive HTTP/1.1 connection to the gateway, opened again when Envoy closes
    it; each path sent exactly as written."""

    def __init__(self, gateway: Gateway, tls: ssl.SSLContext | None) -> None:
        self.gateway, self.tls = gateway, tls
        self.connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        host, port = self.gateway.address.host, self.gateway.address.port
        if self.tls is None:
            return http.client.HTTPConnection(host, port, timeout=10)
        return http.client.HTTPSConnection(host, port, timeout=10, context=self.tls)

    def status(self, path: str) -> int:
        if self.connection is None:
            self.connection = self._connect()
        self.connection.request("GET", path, headers={"host": certs.GATEWAY})
        reply = self.connection.getresponse()
        reply.read()
        if reply.will_close:
            self.connection.close()
            self.connection = None
        return reply.status

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


@contextmanager
def live(config: dict[str, Any], workdir: Path) -> Iterator[tuple[Gateway, Client]]:
    cert_dir = certs.make(workdir / "certs")
    source = workdir / "config.yaml"
    source.write_text(yaml.safe_dump(config, sort_keys=False))
    with running(source, workdir, cert_dir) as gateway:
        client = Client(gateway, tls_client(config, cert_dir))
        try:
            yield gateway, client
        finally:
            client.close()


def disagreements(
    claims: list[route_probes.Claim], gateway: Gateway, client: Client
) -> tuple[list[str], list[route_probes.Claim]]:
    """Send every claim's path; what Envoy did otherwise than claimed, and the claims
    Envoy forwarded. A forward is told by what reached the upstream, not by the status:
    a mint route's filter sends the response to the processor too, so its request is
    forwarded and its answer still fails closed."""
    found: list[str] = []
    forwarded: list[route_probes.Claim] = []
    seen = len(gateway.forwarded())
    for claim in claims:
        assert all(f.certain for f in claim.forwards), claim  # no condition in these configs
        status = client.status(claim.path)
        if claim.status is not None:
            if status != claim.status:
                found.append(f"{claim.path!r}: {status}, claimed {claim.status} ({claim.route})")
            continue
        received = [r["target"] for r in gateway.forwarded()[seen:]]
        seen += len(received)
        if received:
            forwarded.append(claim)
            if received != [claim.upstream]:
                found.append(f"{claim.path!r}: upstream got {received}, claimed {claim.upstream}")
        elif status != FAILED_CLOSED:
            found.append(f"{claim.path!r}: {status} and nothing forwarded, claimed a forward")
    late = gateway.forwarded()[seen:]
    if late:
        found.append(f"forwarded where the check claims an answer: {late}")
    return found, forwarded


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_envoy_does_what_the_check_claims_for_every_probe(path: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    claims = route_probes.claims(routes_of(config))
    assert len(claims) > 500
    # What the check says of the shipped configs: every probe answered 404.
    assert {(c.status, c.forwards) for c in claims} == {(404, ())}
    with live(config, tmp_path) as (gateway, client):
        problems, forwarded = disagreements(claims, gateway, client)
    assert problems == []
    assert forwarded == []


def _first(regex: str) -> Callable[[list[dict[str, Any]]], None]:
    def change(routes: list[dict[str, Any]]) -> None:
        (default,) = [r for r in routes if r.get("name") == "default"]
        edit = copy.deepcopy(default)
        edit.update(name="edit", match={"safe_regex": {"regex": regex}})
        routes.insert(0, edit)

    return change


def _without_echo(routes: list[dict[str, Any]]) -> None:
    routes[:] = [r for r in routes if r.get("name") != "token-endpoint-echo"]


# Edits that make envoy/envoy.yaml forward token paths, and paths no probe is made of
# that each forwards (a pattern route makes no probes).
EDITS: dict[str, tuple[Callable[[list[dict[str, Any]]], None], tuple[str, ...]]] = {
    "regex-catch-all": (_first("/api/.*"), ("/api/inference/v1/generate", "/api/render")),
    "case-insensitive-regex": (_first("(?i)/v2/.*"), ("/V2/inference/v1/generate",)),
    "posix-class": (_first("/[[:alpha:]]+/.*"), ("/api/inference/v1/generate",)),
    "echo-404-removed": (_without_echo, ()),
}


@pytest.mark.parametrize("edit", EDITS)
def test_the_forwards_the_check_claims_happen_on_envoy(edit: str, tmp_path: Path) -> None:
    change, extra = EDITS[edit]
    config = yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())
    change(routes_of(config))
    routes = route_probes.read_routes(routes_of(config))
    claims = [route_probes.claim(routes, p, o) for p, o in route_probes.probes(routes).items()]
    claims += [route_probes.claim(routes, p, "explicit") for p in extra]
    with live(config, tmp_path) as (gateway, client):
        problems, forwarded = disagreements(claims, gateway, client)
    assert problems == []
    # One message per request: the body-less GETs passed the filter, and the upstream
    # received token paths at the very paths the check computed.
    assert forwarded
    assert all(c.upstream is not None and is_token_path(c.upstream) for c in forwarded)
    assert {c.path for c in forwarded} >= set(extra)
