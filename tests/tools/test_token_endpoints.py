"""token_endpoints: the 404 rules answer every downstream path that reaches one of vLLM's
token-in, render or derender endpoints upstream, through any route's prefix and rewrite
and behind any root path; the paths of other APIs pass."""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ext_proc.tools import envoygen, route_probes, token_endpoints
from ext_proc.tools.envoygen import output
from ext_proc.tools.token_endpoints import Match
from tests.tools.envoygen.configs import example

# --- the two regexes answered everywhere ------------------------------------------------

ECHO_PATHS = [
    ("/render", True),
    ("/derender", True),
    ("/v1/chat/completions/render", True),
    ("/v1/completions/derender/", True),
    ("/pd/v1/chat/completions/DeRender", True),
    ("/v1/messages/RENDER", True),
    # The upstream percent-decodes "%0A"; Starlette's "$" matches before it.
    ("/v1/chat/completions/render%0A", True),
    ("/v1/chat/completions/render/%0a", True),
    ("/v1/chat/completions/render/x", False),
    ("/v1/chat/completions/prerender", False),
    ("/v1/chat/completions/render.json", False),
    ("/v1/chat/completions/render%0D%0A", False),
    ("/v1/chat/completions", False),
]


@pytest.mark.parametrize(("path", "closed"), ECHO_PATHS)
def test_the_echo_regex_closes_a_last_render_or_derender_segment(path, closed):
    # Run by RE2, as Envoy runs it (tests/e2e sends these paths through Envoy).
    assert Match("regex", token_endpoints.ECHO_REGEX).matches(path) is closed
    assert token_endpoints.is_token_path(path) is closed


INFERENCE_PATHS = [
    ("/inference", True),
    ("/inference/", True),
    ("/inference/v1/generate", True),
    ("/INFERENCE/V1/GENERATE", True),
    # Behind vLLM's --root-path, or any prefix a proxy strips.
    ("/x/inference/v1/generate", True),
    ("/a/b/Inference/v1/generate", True),
    ("/x/inference", True),
    ("/x/inference%0A", True),
    ("/inferences", False),
    ("/x/inferences/v1/generate", False),
    ("/xinference/v1/generate", False),
    ("/v1/chat/completions", False),
]


@pytest.mark.parametrize(("path", "closed"), INFERENCE_PATHS)
def test_the_inference_regex_closes_the_token_in_api_behind_any_prefix(path, closed):
    regex = Match("regex", token_endpoints.INFERENCE_REGEX)
    assert regex.matches(path) is closed
    assert token_endpoints.is_token_path(path) is closed


# --- the route-specific rules ----------------------------------------------------------


def test_prefixes_under_a_token_endpoint_are_answered_whatever_the_routes():
    assert token_endpoints.answered("/inference/v1/")
    assert token_endpoints.answered("/x/Inference/")
    assert token_endpoints.answered("/Render/x")
    assert token_endpoints.answered("/derender")
    assert not token_endpoints.answered("/x/inference")  # a longer segment may follow
    assert not token_endpoints.answered("/v1/")


def test_only_a_rewrite_under_the_token_in_api_reaches_nothing_else():
    assert token_endpoints.reaches_only("/gen/", "/inference/")
    assert token_endpoints.reaches_only("/gen/", "/x/Inference/v1/")
    assert token_endpoints.reaches_only("/inference/v1/", None)
    assert not token_endpoints.reaches_only("/gen/", "/inf")
    assert not token_endpoints.reaches_only("/pd/v1/", "/v1/")


@pytest.mark.parametrize(
    ("prefix", "rewrite", "regexes"),
    [
        # "/x" + "erence/..." reaches "/inf" + "erence/...".
        ("/x", "/inf", ["(?i)/xerence(/.*|%0a)?"]),
        # The rest of the prefix completes the rewrite's last segment.
        (
            "/x",
            "/",
            ["(?i)/xinference(/.*|%0a)?", "(?i)/xrender/?(%0a)?", "(?i)/xderender/?(%0a)?"],
        ),
        ("/x", "/v1/chat/completions/de", ["(?i)/xrender/?(%0a)?"]),
        # A rewrite ending in "/" leaves nothing to complete but the two regexes' own.
        ("/pd/v1/", "/v1/", []),
        ("/", None, []),
    ],
)
def test_a_rewrite_gets_the_404s_of_the_segments_it_completes(prefix, rewrite, regexes):
    found = token_endpoints.rewritten_into(prefix, rewrite)
    assert [m.value for m in found] == regexes
    assert {m.kind for m in found} <= {"regex"}


def test_probes_reach_each_known_endpoint_under_the_rewrite_and_behind_a_root_path():
    suffixes = token_endpoints.probe_suffixes("/v1/")
    upstream = {"/v1/" + s for s in suffixes}
    for known in token_endpoints.KNOWN:
        assert f"/v1{known}" in upstream
        assert f"/v1{token_endpoints.ROOT_PATH_PROBE}{known}" in upstream
        assert f"/v1{known}%0A".upper() in {p.upper() for p in upstream}
    assert "/v1/chat/completions/render" in upstream  # under the rewrite itself
    assert all(token_endpoints.is_token_path(path) for path in upstream)


@pytest.mark.parametrize(
    ("matcher", "path", "matched"),
    [
        (Match("prefix", "/v1/"), "/V1/x", True),
        (Match("prefix", "/v1/"), "/v1", False),
        (Match("path", "/v1/x"), "/V1/X?q=/v1/", True),
        (Match("path", "/v1/x"), "/v1/x/", False),
        (Match("regex", "(?i)/a/?"), "/A/?q=/b", True),
    ],
)
def test_a_matcher_ignores_case_and_the_query_string(matcher, path, matched):
    assert matcher.matches(path) is matched


# --- property: every path vLLM routes to a token endpoint is answered 404 ---------------

# vLLM's token-in, render and derender routes, written out from vLLM's own route table
# (entrypoints/openai and entrypoints/generate); independent of ``KNOWN``.
VLLM_TOKEN_ROUTES = (
    "/inference/v1/generate",
    "/v1/chat/completions/render",
    "/v1/chat/completions/derender",
    "/v1/completions/render",
    "/v1/completions/derender",
    "/v1/messages/render",
    "/v1/responses/render",
    "/render",
    "/derender",
)
# Route prefixes and rewrites are made of these segments: pieces of the token routes'
# segments (a rewrite "/inf" completed by "erence/..."), and others.
SEGMENTS = ["x", "v1", "V1", "pd", "inf", "In", "ren", "de", "der", "deren", "chat", "comp"]
prefixes = st.builds(
    lambda parts, slash: "/" + "/".join(parts) + ("/" if parts and slash else ""),
    st.lists(st.sampled_from(SEGMENTS), max_size=3),
    st.booleans(),
)


def vllm_routes_to_a_token_endpoint(upstream: str) -> bool:
    """Whether vLLM, started with any ``--root-path`` (or behind a proxy that strips any
    prefix), serves ``upstream`` from a token-in, render or derender route: uvicorn
    percent-decodes the path, Starlette matches a route's pattern with ``$`` (also
    before one final newline) and redirects a path with a trailing slash to the one
    without; case is ignored, for a server that matches paths case-insensitively."""
    path = unquote(upstream.partition("?")[0]).lower()
    path = path.removesuffix("\n").removesuffix("/")
    return path.endswith(VLLM_TOKEN_ROUTES)


def envoy_normalised(path: str) -> str:
    """The path as Envoy's connection manager hands it to route matching for these paths
    (``merge_slashes``; they hold no dot segment or escaped unreserved character)."""
    bare, mark, query = path.partition("?")
    return re.sub("/+", "/", bare) + mark + query


@functools.cache
def generated_routes(prefix: str, rewrite: str | None) -> list[route_probes.Route] | None:
    """The route table the generator writes for one route (``prefix`` rewritten to
    ``rewrite``), as Envoy selects among its routes; None when the generator refuses
    the route (no config: nothing is forwarded)."""
    data: dict[str, Any] = example()
    data["routes"] = [{"prefix": prefix, "prefix_rewrite": rewrite, "upstream": "aggregated"}]
    try:
        spec = envoygen.load_input(data)
    except envoygen.GeneratorError:
        return None
    return route_probes.read_routes([output.as_dict(entry) for entry in output.routes(spec)])


def spellings(path: str) -> list[str]:
    capitalised = "/".join(part[:1].upper() + part[1:] for part in path.split("/"))
    return [path, path.upper(), capitalised]


def reaching(prefix: str, rewrite: str) -> list[str]:
    """Downstream paths that the route sends to a token route upstream: after the
    prefix, what makes ``rewrite`` + it end in one of ``VLLM_TOKEN_ROUTES`` (the
    route's rest completing the rewrite's last characters, right after the rewrite,
    or behind a further root path), each in three cases, with a trailing slash, an
    escaped newline or a query string."""
    lowered = rewrite.lower()
    rests: list[str] = []
    for route in VLLM_TOKEN_ROUTES:
        rests += [
            route[overlap:] for overlap in range(len(route)) if lowered.endswith(route[:overlap])
        ]
        rests.append("/x" + route)
    return [
        prefix + spelled + extra
        for rest in rests
        for spelled in spellings(rest)
        for extra in ("", "/", "%0A", "?x=1")
    ]


@settings(max_examples=150, deadline=None)
@given(prefixes, st.one_of(st.none(), prefixes))
def test_every_path_that_reaches_a_token_endpoint_upstream_is_answered_404(prefix, rewrite):
    routes = generated_routes(prefix, rewrite)
    assume(routes is not None)
    assert routes is not None
    for downstream in reaching(prefix, rewrite if rewrite is not None else prefix):
        assert vllm_routes_to_a_token_endpoint(downstream.replace(prefix, rewrite or prefix, 1))
        claim = route_probes.claim(routes, envoy_normalised(downstream), "property")
        if claim.status is None:
            upstream = claim.upstream
            assert upstream is not None, claim
            assert not vllm_routes_to_a_token_endpoint(upstream), (downstream, claim)
