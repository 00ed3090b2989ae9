"""What the route selection finds becomes findings: one per route that forwards a token
path, and an error for whatever the simulation cannot evaluate exactly."""

import copy

import pytest

from tests.tools.check_envoy.shipped import (
    at,
    forwarding_first,
    found,
    mutated,
    route,
    routes,
    without,
)

POLICY_ROUTES = ["prefill", "disaggregated", "aggregated", "default"]


def test_one_finding_per_route_that_forwards_token_paths():
    report = mutated(without("token-endpoint-echo"))
    assert found(report) == [("token-path-forwarded", at(name)) for name in POLICY_ROUTES]
    (first,) = [f for f in report.findings if f.place == at("disaggregated")]
    # The first path in full, then how many more.
    assert first.message.startswith(
        "forwards '/pd/v1/chat/completions/render' (upstream '/v1/chat/completions/render', "
        "made from route disaggregated) and "
    )


# An audit's six edits of envoy/envoy.yaml passed the check before it read every matcher
# with RE2 and failed closed on what it cannot evaluate; on the real Envoy the pattern
# routes forward token endpoints (tests/e2e/test_live_probe.py sends them). The other
# three are rules of their own (rules/test_filters.py, rules/test_manager.py).
@pytest.mark.parametrize(
    ("regex", "expected"),
    [
        # A catch-all for vLLM under --root-path /api: no probe is made from a regex.
        ("/api/.*", ["pattern-before-404s"]),
        ("(?i)/v2/.*", ["pattern-before-404s"]),
        # RE2 reads a POSIX class: the probes it forwards are found too.
        # (and the endpoints it refuses: it comes before the default route's 404s).
        (
            "/[[:alpha:]]+/.*",
            ["pattern-before-404s", "token-path-forwarded", "refused-endpoint-forwarded"],
        ),
    ],
    ids=["regex-catch-all", "case-insensitive-regex", "posix-class"],
)
def test_a_pattern_route_before_the_404s_is_an_error(regex, expected):
    report = mutated(forwarding_first({"safe_regex": {"regex": regex}}))
    assert found(report) == [(code, at("edit")) for code in expected]


def test_a_pattern_route_after_the_404s_passes():
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="api", match={"safe_regex": {"regex": "/api/.*"}})
        listed = routes(config)
        listed.insert(next(i for i, r in enumerate(listed) if "route" in r), entry)

    assert mutated(change).findings == ()


def test_a_regex_re2_cannot_compile_is_an_error():
    def change(config):
        route(config, "token-endpoint-render")["match"] = {"safe_regex": {"regex": "(?<=x)/"}}

    assert ("route-unreadable", at("token-endpoint-render")) in found(mutated(change))


def test_a_uri_template_outside_envoys_grammar_is_an_error():
    template = {
        "path_match_policy": {
            "name": "envoy.path.match.uri_template.uri_template_matcher",
            "typed_config": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig",
                "path_template": "/{api}.json",
            },
        }
    }
    assert ("route-unreadable", at("tmpl")) in found(mutated(forwarding_first(template, "tmpl")))


def test_a_regex_rewrite_before_the_404s_is_unreadable_and_forwards():
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="legacy", match={"prefix": "/legacy/"})
        entry["route"]["regex_rewrite"] = {
            "pattern": {"regex": "^/legacy/[[:alpha:]]*"},
            "substitution": "/inference",
        }
        routes(config).insert(0, entry)

    assert found(mutated(change)) == [
        ("rewrite-unreadable", at("legacy")),
        ("token-path-forwarded", at("legacy")),
        # Before every route's own 404s: its refused endpoints are forwarded too.
        ("refused-endpoint-forwarded", at("legacy")),
    ]


# --- the endpoints a route refuses (refused_paths) -------------------------------------


@pytest.mark.parametrize("name", POLICY_ROUTES)
def test_a_route_without_its_refused_404_forwards_them(name):
    report = mutated(without(f"token-endpoint-{name}-refused"))
    assert found(report) == [("refused-endpoint-forwarded", at(name))]
    (finding,) = report.findings
    assert "a request without one" in finding.message


def test_a_route_that_accepts_them_needs_no_404():
    def change(config):
        without("token-endpoint-aggregated-refused")(config)
        policy = route(config, "aggregated")["metadata"]["filter_metadata"]
        policy["ext_proc.token_policy"]["accept"] = "internal_endpoints|token_endpoints"

    assert found(mutated(change)) == []


def test_a_route_accepting_one_class_still_forwards_the_other():
    def change(config):
        without("token-endpoint-aggregated-refused")(config)
        policy = route(config, "aggregated")["metadata"]["filter_metadata"]
        policy["ext_proc.token_policy"]["accept"] = "internal_endpoints"

    (finding,) = mutated(change).findings
    assert finding.code == "refused-endpoint-forwarded"
    assert "generative_scoring" in finding.message
