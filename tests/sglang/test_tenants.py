"""Tenants as SGLang reads them: on a route that names a tenant source, what reaches
SGLang's request model carries the gateway's cache_salt, whatever the client sent, and
an endpoint whose partition SGLang takes from elsewhere (``/vertex_generate`` reads the
client's ``parameters.cache_salt``) is refused before anything is forwarded
(docs/trust.md#tenants). Judged by SGLang's own models and handler (``parse_request``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ext_proc.core import tenants
from tests.e2e.stack import Stack, route
from tests.e2e.test_gateway import only_request
from tests.sglang.conftest import BODY_MODES
from tests.sglang.sglang_env import Case, Parser
from tests.sglang.test_sglang import VERTEX, post, read, straight

KEY = b"tenant-key-of-this-sglang-gateway!"
TENANT = "route:team-s"
VICTIM = "the-salt-of-another-tenant"


@pytest.fixture(scope="module")
def tenanted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("sglang-tenants")
    key_file = workdir / "tenant.key"
    key_file.write_bytes(KEY)
    routes = [route("team", "/team/", {"action": "strip", "tenant": TENANT}, "/")]
    config = {"tenants": {"key_file": str(key_file)}}
    with Stack(
        workdir, source=BODY_MODES["one-message"], routes=routes, processor_config=config
    ) as stack:
        yield stack


def salt(part: str | None) -> str:
    return tenants.salt(tenants.key_for(KEY, TENANT), part)


BODIES: dict[str, dict[str, Any]] = {
    "/generate": {"text": "hi", "cache_salt": VICTIM, "extra_key": "mine"},
    "/v1/chat/completions": {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "cache_salt": VICTIM,
    },
    "/v1/completions": {"model": "m", "prompt": "hi", "cache_salt": VICTIM},
}


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_sglang_reads_the_gateways_salt_not_the_clients(tenanted, sglang, endpoint):
    sent = BODIES[endpoint]
    # The control: straight, SGLang takes the client's salt as its partition.
    assert (
        read(sglang, endpoint, straight(tenanted, endpoint, sent)).members["cache_salt"] == VICTIM
    )

    tenanted.clear()
    reply = post(f"{tenanted.url}/team{endpoint}", sent, {})
    assert reply.status_code == 200, reply.text
    members = read(sglang, endpoint, only_request(tenanted)).members
    assert members["cache_salt"] == salt(VICTIM)
    assert members.get("extra_key") == sent.get("extra_key")  # a division of the partition


def test_vertex_generate_takes_the_clients_salt_so_a_tenant_route_refuses_it(
    tenanted, sglang: Parser
):
    sent = {"instances": [{"text": "hi"}], "parameters": {"cache_salt": VICTIM}}
    # The control: SGLang's own handler builds its request with the client's salt.
    (built,) = sglang.read([Case(VERTEX, straight(tenanted, "/vertex_generate", sent).body)])
    assert built.error is None, built.error
    assert built.members["cache_salt"] == VICTIM

    tenanted.clear()
    reply = post(f"{tenanted.url}/team/vertex_generate", sent, {})
    assert reply.status_code == 400, reply.text
    assert "cache_salt" in reply.json()["error"]["message"]
    assert tenanted.received() == []
