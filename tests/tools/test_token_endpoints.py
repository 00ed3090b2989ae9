"""token_endpoints: the 404 rules answer every downstream path that reaches one of vLLM's
token-in, render or derender endpoints upstream, through any route's prefix and rewrite
and behind any root path; the paths of other APIs pass."""

from __future__ import annotations

import pytest

from ext_proc.tools import token_endpoints
from ext_proc.tools.token_endpoints import Match

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
