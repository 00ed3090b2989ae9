"""vLLM's token-in and echo endpoints are not public: the real Envoy answers them 404 in
vLLM's error shape, as each shipped route's upstream would see them after its rewrite,
behind any prefix (vLLM's --root-path serves them there too), whatever spelling of the
path a client tries, and forwards nothing.

Envoy runs each shipped body arrangement with no processor (``envoy_alone``): a path
that reached a policy route would fail closed (503 with retry-after), so a 404 comes
from the token endpoint routes and the stub upstream shows that nothing was forwarded.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ext_proc.tools import envoygen
from ext_proc.tools.token_endpoints import KNOWN
from tests.e2e.conftest import BODY_MODES
from tests.e2e.envoy_alone import REPO, Gateway, Reply, running

NOT_FOUND = {"error": {"message": "not found", "type": "NotFoundError", "param": None, "code": 404}}
IDS = json.dumps({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1}}).encode()
# The shipped routes: prefix, and what the upstream sees in its place.
SHIPPED_ROUTES = {"/pd/prefill/v1/": "/v1/", "/pd/v1/": "/v1/", "/v1/": "/v1/", "/": "/"}


def downstream_paths() -> list[str]:
    """Every known token endpoint, as a client reaches it through each shipped route."""
    return sorted(
        {
            prefix + path.removeprefix(rewrite)
            for prefix, rewrite in SHIPPED_ROUTES.items()
            for path in KNOWN
            if path.startswith(rewrite)
        }
    )


def _escaped(path: str) -> str:
    """The last segment's first letter percent-encoded ("render" -> "%72ender"), upper-
    case hex for "d" ("%44erender" after Envoy's decoding is "Derender")."""
    head, _, last = path.rpartition("/")
    letter = last[0]
    code = f"%{ord(letter.upper() if letter == 'd' else letter):02x}"
    return f"{head}/{code}{last[1:]}"


def spellings(path: str) -> dict[str, str]:
    """``path`` as clients may spell it, by the name of the spelling."""
    head, _, last = path.rpartition("/")
    return {
        "plain": path,
        "upper": path.upper(),
        "last-segment-capitalised": f"{head}/{last.capitalize()}",
        "trailing-slash": f"{path}/",
        "query": f"{path}?stream=false",
        "escaped-letter": _escaped(path),
        "doubled-slashes": path.replace("/", "//"),
        "dot-segments": f"{head}/./x/../{last}",
        # The upstream percent-decodes it and Starlette's "$" matches before it.
        "escaped-newline": f"{path}%0A",
    }


@pytest.fixture(scope="module", params=list(BODY_MODES))
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    source: Path = BODY_MODES[request.param]
    with running(source, tmp_path_factory.mktemp(f"token-{request.param}")) as running_:
        yield running_


def post(gateway: Gateway, path: str) -> Reply:
    """One POST, the path sent exactly as written; the reply read to its length (not to
    the end of the connection, which Envoy delays up to its delayed_close_timeout)."""
    address = gateway.address
    connection = http.client.HTTPConnection(address.host, address.port, timeout=10)
    try:
        headers = {"content-type": "application/json", "connection": "close"}
        connection.request("POST", path, IDS, headers)
        reply = connection.getresponse()
        return Reply(reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read())
    finally:
        connection.close()


def assert_not_found(gateway: Gateway, path: str) -> None:
    reply = post(gateway, path)
    assert reply.status == 404, (path, reply)
    assert reply.headers["content-type"] == "application/json", path
    assert json.loads(reply.body) == NOT_FOUND, path


def test_every_shipped_route_reaches_render_paths():
    # The list below covers each route's own token endpoints, not only the root's.
    paths = downstream_paths()
    assert "/pd/v1/chat/completions/derender" in paths
    assert "/pd/prefill/v1/completions/render" in paths
    assert "/inference/v1/generate" in paths
    # The root route reaches every one, /v1/ the same six as the root, /pd/v1/ and
    # /pd/prefill/v1/ those six under their own prefixes.
    assert len(paths) == len(KNOWN) + 2 * 6


@pytest.mark.parametrize("path", downstream_paths())
def test_token_endpoints_answer_404_in_every_spelling(gateway: Gateway, path: str) -> None:
    for name, spelled in spellings(path).items():
        try:
            assert_not_found(gateway, spelled)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {spelled!r}") from exc
    assert gateway.forwarded() == []


@pytest.mark.parametrize(
    "path",
    [
        "/inference",
        "/INFERENCE/",
        "/render/sub",
        "/renderer",
        "/derender?x=1",
        "/pd/v1/messages/render",
        "/pd/prefill/v1/responses/Render",
        "/anything/else/render",
        # Behind a root path (vLLM's --root-path /x serves these too).
        "/x/inference/v1/generate",
        "/x/y/Inference/v1/generate?x=1",
        "/pd/v1/inference/v1/generate",
        "/x/v1/chat/completions/render",
        "/pd/prefill/v1/x/v1/completions/derender",
        "/x/inference",
        "/x/inference%0A",
        # Spellings the path normalisation brings back to a token endpoint.
        "//inference//v1/generate",
        "/./render",
        "/v1/../derender",
        "/pd/v1/../../inference/v1/generate",
        "/v1/%2e%2e/render",
        "/%69nference/v1/generate",
        "/pd/v1/chat/completions/%64%65render",
        "/pd/v1/chat/completions/%44erender",
        "/v1/chat/completions/render/%0a",
    ],
)
def test_other_token_endpoint_spellings_answer_404(gateway: Gateway, path: str) -> None:
    assert_not_found(gateway, path)
    assert gateway.forwarded() == []


@pytest.mark.parametrize(
    ("path", "normalised"),
    [
        ("/v1/..%2Frender", "/render"),
        ("/%2Finference/v1/generate", "/inference/v1/generate"),
        ("/pd/v1/chat/completions%2Fderender", "/pd/v1/chat/completions/derender"),
    ],
)
def test_escaped_slashes_redirect_to_the_normalised_path(
    gateway: Gateway, path: str, normalised: str
) -> None:
    reply = post(gateway, path)
    assert reply.status == 307
    assert reply.headers["location"] == normalised
    assert gateway.forwarded() == []


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/pd/v1/chat/completions",
        "/pd/prefill/v1/chat/completions",
        "/inferences",
        "/x/inferences/v1/generate",
        "/xinference/v1/generate",
        "/v1/renderer",
        "/v1/chat/completions/prerender",
        "/v1/chat/completions/render/x",
        # No upstream route matches "render\r\n" (Starlette's "$" skips "\n" only).
        "/v1/chat/completions/render%0D%0A",
    ],
)
def test_other_paths_reach_the_policy_routes(gateway: Gateway, path: str) -> None:
    # A policy route asks the processor first; there is none here, so it fails closed
    # (503 to retry) instead of answering 404: the token routes catch only their own paths.
    reply = post(gateway, path)
    assert (reply.status, reply.headers.get("retry-after")) == (503, "1"), (path, reply)
    assert gateway.forwarded() == []


@pytest.fixture(scope="module")
def rewriting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A generated config with routes whose rewrites reach the token endpoints from
    paths no root 404 covers: ``/pd/`` rewritten to ``/``, ``/x`` rewritten to ``/v1/``."""
    data = yaml.safe_load((REPO / "deploy" / "envoy-config.example.yaml").read_text())
    data["routes"][:0] = [
        {"name": "pd-root", "prefix": "/pd/", "prefix_rewrite": "/", "upstream": "aggregated"},
        {"name": "glued", "prefix": "/x", "prefix_rewrite": "/v1/", "upstream": "aggregated"},
    ]
    workdir = tmp_path_factory.mktemp("rewriting")
    path = workdir / "generated.yaml"
    path.write_text(envoygen.render(envoygen.load_input(data)))
    with running(path, workdir) as running_:
        yield running_


@pytest.mark.parametrize(
    "path",
    [
        "/pd/inference/v1/generate",
        "/pd/INFERENCE/v1/generate?x=1",
        "/pd/%69nference",
        "/pd//inference/v1/generate",
        "/xrender",
        "/XDERENDER/",
        "/x%72ender%0A",
        # "/x" rewritten to "/v1/": /v1/inference/v1/generate upstream (root path /v1).
        "/xinference/v1/generate",
        "/XINFERENCE",
    ],
)
def test_a_rewrite_onto_a_token_endpoint_gets_its_own_404s(rewriting: Gateway, path: str) -> None:
    assert_not_found(rewriting, path)
    assert rewriting.forwarded() == []


def test_the_rewriting_routes_still_reach_their_policy(rewriting: Gateway) -> None:
    for path in ("/pd/v1/chat/completions", "/xv1", "/pd/inferences"):
        assert post(rewriting, path).status == 503, path
    assert rewriting.forwarded() == []
