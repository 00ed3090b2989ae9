import copy
from pathlib import Path

import pytest
import yaml

from ext_proc.tools import route_probes
from ext_proc.tools.token_endpoints import ECHO_REGEX, INFERENCE_REGEX, is_token_path

SHIPPED = yaml.safe_load((Path(__file__).resolve().parents[2] / "envoy" / "envoy.yaml").read_text())


def shipped_routes():
    manager = SHIPPED["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    return copy.deepcopy(manager["typed_config"]["route_config"]["virtual_hosts"][0]["routes"])


def forward(name, match, **action):
    return {"name": name, "match": match, "route": {"cluster": "c", **action}}


NOT_FOUND = {"direct_response": {"status": 404}}


def test_every_probe_of_the_shipped_config_is_answered_404_by_a_token_route():
    found = route_probes.claims(shipped_routes())
    assert len(found) > 1000
    for claim in found:
        assert (claim.status, claim.forwards) == (404, ()), claim
        assert claim.route is not None
        assert claim.route.startswith("token-endpoint-"), claim
    paths = {c.path for c in found}
    # Behind vLLM's --root-path, under each route and its rewrite.
    assert "/x/inference/v1/generate" in paths
    assert "/pd/v1/x/v1/chat/completions/render" in paths
    assert "/pd/v1/inference/v1/generate" in paths


def test_without_the_404s_the_probes_are_forwarded_rewritten():
    routes = [r for r in shipped_routes() if "route" in r]
    by_path = {c.path: c for c in route_probes.claims(routes)}
    found = by_path["/pd/v1/x/inference/v1/generate"]
    assert (found.route, found.status) == ("disaggregated", None)
    assert found.upstream == "/v1/x/inference/v1/generate"
    assert found.origin == "disaggregated"
    assert all(is_token_path(c.upstream) for c in by_path.values() if c.upstream)


def test_the_first_matching_route_decides_and_conditions_do_not():
    routes = route_probes.read_routes(
        [
            forward("by-header", {"prefix": "/", "headers": [{"name": "x"}]}),
            {"name": "echo", "match": {"safe_regex": {"regex": ECHO_REGEX}}, **NOT_FOUND},
            forward("rest", {"prefix": "/"}),
        ]
    )
    answered = route_probes.claim(routes, "/v1/render", "test")
    assert (answered.route, answered.status) == ("echo", 404)
    # The conditional route may take it first.
    assert answered.forwards == (route_probes.Forward("by-header", "/v1/render", certain=False),)
    passed = route_probes.claim(routes, "/v1/chat", "test")
    assert (passed.route, passed.status, passed.upstream) == ("rest", None, "/v1/chat")
    nothing = route_probes.claim(routes[1:2], "/v1/chat", "test")
    assert (nothing.route, nothing.status) == (None, route_probes.NO_ROUTE)


def test_redirects_answer_with_their_status():
    routes = route_probes.read_routes(
        [
            {"name": "r", "match": {"prefix": "/"}, "redirect": {"response_code": "FOUND"}},
        ]
    )
    assert route_probes.claim(routes, "/x", "t").status == 302


def test_probes_come_from_literal_starts_only():
    routes = route_probes.read_routes(
        [
            forward("regex", {"safe_regex": {"regex": "/api/.*"}}),
            forward("health", {"path": "/health"}),
            forward("pd", {"path_separated_prefix": "/pd/v1"}, prefix_rewrite="/v1"),
        ]
    )
    made = route_probes.probes(routes)
    assert {made[p] for p in made} == {"health", "pd"}
    assert made["/health"] == "health"
    assert "/pd/v1/chat/completions/render" in made
    assert "/pd/v1/x/inference/v1/generate" in made


def test_a_route_that_cannot_be_read_may_match_anything():
    routes = route_probes.read_routes(
        [forward("odd", {"safe_regex": {"regex": "(?<=x)"}}), forward("rest", {"prefix": "/"})]
    )
    assert routes[0].problem is not None
    assert routes[0].problem.startswith("RE2 cannot compile")
    found = route_probes.claim(routes, "/render", "t")
    assert [f.route for f in found.forwards] == ["odd", "rest"]
    assert not found.forwards[0].certain


EVERYWHERE = [
    {"name": "echo", "match": {"safe_regex": {"regex": ECHO_REGEX}}, **NOT_FOUND},
    {"name": "inference", "match": {"safe_regex": {"regex": INFERENCE_REGEX}}, **NOT_FOUND},
]


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        # Before the two regexes, a pattern route forwards token paths nobody probes.
        ([forward("api", {"safe_regex": {"regex": "/api/.*"}}), *EVERYWHERE], ["api"]),
        ([EVERYWHERE[0], forward("v2", {"safe_regex": {"regex": "(?i)/v2/.*"}})], ["v2"]),
        (
            [forward("t", {"path_match_policy": {"name": "x"}}), *EVERYWHERE],
            ["t"],
        ),
        # After both, what they do not answer is no token path: nothing to tell.
        ([*EVERYWHERE, forward("api", {"safe_regex": {"regex": "/api/.*"}})], []),
        # A prefix route is probed instead.
        ([forward("v1", {"prefix": "/v1/"}), *EVERYWHERE], []),
    ],
)
def test_pattern_routes_before_the_404s_of_every_token_path_are_unguarded(entries, named):
    routes = route_probes.read_routes(entries)
    assert [r.label for r in route_probes.unguarded(routes)] == named


def test_a_conditional_regex_404_does_not_guard():
    conditional = copy.deepcopy(EVERYWHERE)
    conditional[0]["match"]["headers"] = [{"name": "x"}]
    routes = route_probes.read_routes(
        [*conditional, forward("api", {"safe_regex": {"regex": "/api/.*"}})]
    )
    assert [r.label for r in route_probes.unguarded(routes)] == ["api"]


@pytest.mark.parametrize(
    ("action", "problem"),
    [
        ({"regex_rewrite": {"pattern": {"regex": "^/a"}, "substitution": "/"}}, "regex_rewrite"),
        ({"path_rewrite_policy": {}}, "path_rewrite_policy"),
    ],
)
def test_rewrites_whose_token_paths_cannot_be_told(action, problem):
    (route,) = route_probes.read_routes([forward("r", {"prefix": "/"}, **action)])
    assert route.rewrite_problem() == f"{problem} is not supported"


def test_a_prefix_rewrite_of_a_regex_match_cannot_be_followed():
    (route,) = route_probes.read_routes(
        [forward("r", {"safe_regex": {"regex": "/a/.*"}}, prefix_rewrite="/b/")]
    )
    assert route.rewrite_problem() == "prefix_rewrite with a safe_regex matcher"
    (plain,) = route_probes.read_routes([forward("p", {"prefix": "/a/"}, prefix_rewrite="/b/")])
    assert plain.rewrite_problem() is None


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (forward("c", {"connect_matcher": {}}), "match ['connect_matcher'] is not simulated"),
        (forward("n", {"prefix": "/", "new": {}}), "match ['new'] is not simulated"),
        (
            {"name": "f", "match": {"prefix": "/"}, "filter_action": {}},
            "the action of ['filter_action', 'match', 'name'] is not simulated",
        ),
    ],
)
def test_what_the_simulation_does_not_know_is_a_problem(entry, problem):
    (route,) = route_probes.read_routes([entry])
    assert route.problem == problem
    assert route.may_match("/anything")
