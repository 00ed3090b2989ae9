"""Route selection for the paths that reach a token endpoint: which route takes each
probe, and where it sends it."""

import copy

import pytest
import yaml

from ext_proc.tools.check_envoy.selection import PatternRoute, TokenForward, select
from tests.tools.check_envoy.shipped import (
    SHIPPED,
    SHIPPED_CONFIGS,
    forwarding_first,
    policy,
    route,
    routes,
    without,
)

POLICY_ROUTES = {"prefill", "disaggregated", "aggregated", "default"}


def selected(change):
    config = copy.deepcopy(SHIPPED)
    change(config)
    return select(routes(config))


def forwarded(change):
    """Each forwarding route's token paths: (probe, upstream)."""
    out = {}
    for forward in selected(change).forwards:
        out.setdefault(forward.route, []).append((forward.path, forward.upstream))
    return out


def test_the_shipped_routes_forward_no_token_path():
    found = select(routes(SHIPPED))
    assert (found.forwards, found.unguarded) == ([], [])
    assert [r.problem for r in found.routes] == [None] * len(routes(SHIPPED))


def test_the_shipped_config_before_the_echo_route_forwarded_render_paths():
    # The 404s of the root prefixes alone: each policy route passes its own render and
    # derender paths to vLLM, rewritten.
    found = selected(without("token-endpoint-echo")).forwards
    assert {f.route for f in found} == POLICY_ROUTES
    assert found[[f.route for f in found].index("disaggregated")] == TokenForward(
        "disaggregated",
        "/pd/v1/chat/completions/render",
        "/v1/chat/completions/render",
        "disaggregated",
        certain=True,
    )


@pytest.mark.parametrize(
    ("regex", "probe"),
    [
        # Case-sensitive: upper-case spellings pass.
        (".*/(de)?render/?(%0[aA])?", "/pd/prefill/v1/CHAT/COMPLETIONS/RENDER"),
        # No trailing slash, no escaped newline, no derender.
        ("(?i).*/(de)?render(%0a)?", "/pd/prefill/v1/chat/completions/render/"),
        ("(?i).*/(de)?render/?", "/pd/prefill/v1/chat/completions/render%0A"),
        ("(?i).*/render/?(%0a)?", "/pd/prefill/v1/chat/completions/derender"),
        # Python's re takes "{,4096}" for a repetition; RE2 for the literal text, so this
        # 404 answers nothing on Envoy.
        ("(?i).{,4096}/(de)?render/?(%0a)?", "/pd/prefill/v1/chat/completions/render"),
    ],
)
def test_a_narrower_echo_route_is_caught(regex, probe):
    def change(config):
        route(config, "token-endpoint-echo")["match"]["safe_regex"]["regex"] = regex

    assert probe in [path for path, _ in forwarded(change)["prefill"]]


def test_case_variants_are_probed():
    def change(config):
        route(config, "token-endpoint-echo")["match"]["safe_regex"]["regex"] = ".*/(de)?render/?"

    assert "/V1/CHAT/COMPLETIONS/RENDER" in [path for path, _ in forwarded(change)["default"]]


def test_the_token_in_api_is_probed():
    # At the root and behind a root path (vLLM's --root-path) under every route.
    found = forwarded(without("token-endpoint-inference"))
    assert set(found) == POLICY_ROUTES
    assert ("/inference/v1/generate", "/inference/v1/generate") in found["default"]
    assert ("/pd/v1/inference/v1/generate", "/v1/inference/v1/generate") in found["disaggregated"]


def test_the_first_matching_route_decides():
    def last(config):
        entries = routes(config)
        echo = route(config, "token-endpoint-echo")
        entries.remove(echo)
        entries.append(echo)

    assert set(forwarded(last)) == POLICY_ROUTES


def _inserted(prefix, rewrite, name="pd-root"):
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name=name, match={"prefix": prefix})
        entry["route"]["prefix_rewrite"] = rewrite
        policy_fields = entry["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        policy_fields.update(match_prefix=prefix, prefix_rewrite=rewrite)
        routes(config).insert(4, entry)

    return change


@pytest.mark.parametrize(
    ("prefix", "rewrite", "probe", "upstream"),
    [
        # What follows the prefix completes the rewrite's last segment.
        ("/pd/", "/inf", "/pd/erence/v1/generate", "/inference/v1/generate"),
        ("/pd/", "/x/inf", "/pd/erence/v1/generate", "/x/inference/v1/generate"),
        ("/pd", "/v1/", "/pdinference/v1/generate", "/v1/inference/v1/generate"),
    ],
)
def test_a_route_rewritten_onto_the_token_in_api_is_probed(prefix, rewrite, probe, upstream):
    found = forwarded(_inserted(prefix, rewrite))
    assert set(found) == {"pd-root"}
    assert (probe, upstream) in found["pd-root"]


def test_a_route_rewritten_behind_a_root_path_is_answered_by_the_regex():
    # /pd/inference/v1/generate reaches /inference/v1/generate, and the 404 of an
    # inference segment behind any prefix answers it before the route.
    assert forwarded(_inserted("/pd/", "/")) == {}


def test_a_conditional_404_does_not_count_and_a_conditional_route_may_forward():
    def conditional_404(config):
        route(config, "token-endpoint-echo")["match"]["headers"] = [
            {"name": "x-block", "present_match": True}
        ]

    assert "disaggregated" in forwarded(conditional_404)

    def conditional_route(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="by-header", match={"prefix": "/", "headers": [{"name": "x-a"}]})
        routes(config).insert(0, entry)

    found = selected(conditional_route).forwards
    assert {f.route for f in found} == {"by-header"}
    assert not any(f.certain for f in found)


def test_a_path_separated_prefix_route_is_probed():
    def change(config):
        without("token-endpoint-echo")(config)
        entry = route(config, "disaggregated")
        entry["match"] = {"path_separated_prefix": "/pd/v1"}
        entry["route"]["prefix_rewrite"] = "/v1"
        policy(config, "disaggregated").update(match_prefix="/pd/v1", prefix_rewrite="/v1")

    assert ("/pd/v1/chat/completions/render", "/v1/chat/completions/render") in forwarded(change)[
        "disaggregated"
    ]


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_the_configs_shipped_before_the_echo_route_forward_render_paths(path):
    # What every shipped config was before the render and derender paths were closed
    # wherever they occur: the policy routes forward them.
    config = yaml.safe_load(path.read_text())
    binding = {
        r["name"]
        for r in routes(config)
        if r.get("metadata", {})
        .get("filter_metadata", {})
        .get("ext_proc.token_policy", {})
        .get("action")
        in ("mint", "honor")
    }
    assert binding
    without("token-endpoint-echo")(config)
    assert {f.route for f in select(routes(config)).forwards} >= binding


@pytest.mark.parametrize(
    ("prefix", "rewrite", "probe"),
    [
        ("/gen/", "/%69nference/v1/", "/gen/generate"),
        ("/s/", "/v1/chat/completions/%72ender/", "/s/"),
    ],
)
def test_a_rewrite_into_a_token_endpoint_spelled_with_escapes_is_caught(prefix, rewrite, probe):
    # The upstream percent-decodes the path: what the rewrite writes is judged decoded.
    def change(config):
        entry = copy.deepcopy(route(config, "aggregated"))
        entry["name"] = "escaped"
        entry["match"] = {"prefix": prefix}
        entry["route"]["prefix_rewrite"] = rewrite
        # After the token endpoint 404s, which answer every other probe of it.
        listed = routes(config)
        first = next(i for i, r in enumerate(listed) if "direct_response" not in r)
        listed.insert(first, entry)

    assert probe in [path for path, _ in forwarded(change)["escaped"]]


@pytest.mark.parametrize("regex", ["/api/.*", "(?i)/v2/.*", "/[[:alpha:]]+/.*"])
def test_a_pattern_route_before_the_404s_is_unguarded(regex):
    found = selected(forwarding_first({"safe_regex": {"regex": regex}}))
    assert found.unguarded == [PatternRoute("edit", "safe_regex", regex)]


def test_a_posix_class_is_read_as_re2_reads_it():
    # Python's re reads "[[:alpha:]]" as a nested set and matches no probe; RE2 forwards.
    found = forwarded(forwarding_first({"safe_regex": {"regex": "/[[:alpha:]]+/.*"}}))
    assert ("/render/", "/render/") in found["edit"]


def test_a_uri_template_route_is_matched_as_envoy_matches_it():
    template = {
        "path_match_policy": {
            "name": "envoy.path.match.uri_template.uri_template_matcher",
            "typed_config": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig",
                "path_template": "/{api}/**",
            },
        }
    }
    # Before the 404s it takes what the probes send ("**" matches the empty rest too).
    assert ("/render/", "/render/") in forwarded(forwarding_first(template, "tmpl"))["tmpl"]


def test_a_case_insensitive_prefix_before_the_404s_is_probed_in_every_case():
    found = forwarded(forwarding_first({"prefix": "/API/", "case_sensitive": False}, "ci"))
    assert "/API/inference/v1/generate" in [path for path, _ in found["ci"]]


def test_a_regex_rewrite_is_evaluated_with_re2_where_it_is_selected():
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="legacy", match={"prefix": "/legacy/"})
        entry["route"]["regex_rewrite"] = {
            "pattern": {"regex": "^/legacy/[[:alpha:]]*"},
            "substitution": "/inference",
        }
        routes(config).insert(0, entry)

    found = selected(change)
    (legacy,) = [r for r in found.routes if r.label == "legacy"]
    assert legacy.rewrite_problem() == "regex_rewrite is not supported"
    assert any(f.upstream.startswith("/inference/") for f in found.forwards if f.upstream)


def test_a_route_with_a_header_condition_does_not_hide_the_routes_after_it():
    # Requests without the header fall through to the next routes: a rewrite onto the
    # token-in API after it is still found.
    rewrites = {
        "name": "rewrites",
        "match": {"prefix": "/pd2/"},
        "route": {"cluster": "aggregated", "prefix_rewrite": "/inf"},
    }
    phase = {
        "name": "phase",
        "match": {
            "prefix": "/",
            "headers": [{"name": "epp-profile", "string_match": {"exact": "x"}}],
        },
        "route": {"cluster": "aggregated"},
    }

    for added in ([rewrites], [phase, rewrites]):

        def change(config, added=added):
            listed = routes(config)
            first = next(i for i, r in enumerate(listed) if "route" in r)
            listed[first:first] = copy.deepcopy(added)

        assert "rewrites" in forwarded(change), added
