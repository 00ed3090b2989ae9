"""refused_paths: a route's 404 regex matches exactly the downstream paths that reach,
through its rewrite, an endpoint its policy refuses as the processor judges it
(``vllm_request.token_endpoint``, ``internal_endpoint``); probes and regex agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.core.route_policy import Accept
from ext_proc.tools import refused_paths
from ext_proc.tools.refused_paths import (
    PROGRAM_SIZE_LIMIT,
    completion,
    probe_suffixes,
    refused_at,
    refused_names,
    route_regex,
)
from ext_proc.tools.route_match import compile_re2

SHIPPED = sorted((Path(__file__).parents[2] / "envoy").glob("*.yaml"))
ALL = refused_names(())
ROUTES = [
    ("/", None),
    ("/v1/", None),
    ("/pd/v1/", "/v1/"),
    ("/pd/prefill/v1/", "/v1/"),
    ("/x", "/flu"),
    ("/y/", "/dumper"),
    ("/z", "/hicache/st"),
    ("/w", "/v1/load"),
    ("/q/", "/flush_cache/"),
    ("/s", "/Sleep"),
]


def matches(prefix: str, rewrite: str | None, path: str, names=ALL) -> bool:
    regex = route_regex(prefix, rewrite, names)
    assert regex is not None
    return compile_re2(regex).fullmatch(path.partition("?")[0]) is not None


def judged(prefix: str, rewrite: str | None, path: str, accept=()) -> bool:
    """The processor's judgement of the upstream path the route sends ``path`` to."""
    upstream = (rewrite if rewrite is not None else prefix) + path[len(prefix) :]
    return refused_at(upstream, accept) is not None


@pytest.mark.parametrize(("prefix", "rewrite"), ROUTES)
def test_every_probe_is_judged_alike_by_the_regex_and_the_processor(prefix, rewrite):
    suffixes = probe_suffixes((rewrite or prefix), ALL)
    assert suffixes
    for suffix in suffixes:
        path = prefix + suffix
        assert matches(prefix, rewrite, path) is judged(prefix, rewrite, path), path


# A path's pieces: a name a route refuses, a spelling of it, what surrounds it (those
# under an inference segment are answered before every route: test_token_endpoints).
NAMES = st.sampled_from(ALL)
SEGMENT = st.sampled_from(["v1", "x", "flush", "sleep", "pause", "hicache", "dumper", "a_b", ""])
TAILS = st.sampled_from(["", "/", "//", "%0a", "%0A", "/%0a", "%0a/", "x", "_x", "/x", "?q=1"])


def spell(name: str, upper: bool) -> str:
    text = "/".join("m" if part.startswith("{") else part for part in name.split("/"))
    return text.upper() if upper else text


@settings(max_examples=400, deadline=None)
@given(
    route=st.sampled_from(ROUTES),
    before=st.lists(SEGMENT, max_size=3),
    name=NAMES,
    upper=st.booleans(),
    cut=st.integers(0, 30),
    tail=TAILS,
)
def test_the_regex_and_the_processor_agree_on_generated_paths(
    route, before, name, upper, cut, tail
):
    prefix, rewrite = route
    spelled = spell(name, upper)
    # The name whole behind segments, or cut anywhere (as a rewrite would leave it).
    rest = "/".join(before) + spelled[min(cut, len(spelled)) :] + tail
    path = prefix + rest
    assert matches(prefix, rewrite, path) is judged(prefix, rewrite, path), path


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ("/v1/flush_cache", True),
        ("/v1/x/FLUSH_CACHE/", True),
        ("/v1/sleep%0A", True),
        ("/v1/dumper/anything", True),
        # A final "{name}" segment may be empty: "/dumper/%0A" reaches the upstream as
        # "/dumper/\n", whose newline Starlette takes as the segment.
        ("/v1/dumper/", True),
        ("/v1/dumper/%0a", True),
        ("/v1/dumper", False),
        ("/v1/dumper/a/b", False),
        ("/v1/hicache/storage-backend/clear", True),
        ("/v1/flush_cache_x", False),
        ("/v1/my_flush_cache", False),
        ("/v1/flush_cache/x", False),
        ("/v1/chat/completions", False),
        ("/V1/flush_cache", False),  # another route's prefix: the route matches by case
    ],
)
def test_a_route_without_rewrite(path, refused):
    assert matches("/v1/", None, path) is refused


def test_a_rewrite_reaches_a_name_across_its_boundary():
    # "/x" rewritten to "/flu": "/xsh_cache" is /flush_cache upstream.
    assert matches("/x", "/flu", "/xsh_cache")
    assert matches("/y/", "/dumper", "/y//anything")
    assert matches("/z", "/hicache/st", "/zorage-backend/clear")
    assert not matches("/x", "/flu", "/xsh")
    # A rewrite onto an endpoint reaches it with nothing after the prefix.
    assert matches("/q/", "/flush_cache/", "/q/")
    assert matches("/s", "/Sleep", "/s")
    assert matches("/s", "/Sleep", "/s%0a")


def test_completion_follows_template_segments():
    assert completion("/dumper/ab", "/dumper/{method}") == refused_paths.Completion("[^/]*", "")
    assert completion("/dumper/", "/dumper/{method}") == refused_paths.Completion("[^/]*", "m")
    assert completion("/dump", "/dumper/{method}") == refused_paths.Completion("er/[^/]*", "er/m")
    assert completion("/workers/", "/workers/{worker_id}/drain") == refused_paths.Completion(
        "[^/]+/drain", "m/drain"
    )
    assert completion("/flush_cache//", "/flush_cache") == refused_paths.Completion("", "")
    assert completion("/flush_cache/x", "/flush_cache") is None
    assert completion("/v2/", "/v1/load_lora_adapter") is None


def test_a_route_accepting_a_class_refuses_the_other():
    token_only = refused_names({Accept.INTERNAL_ENDPOINTS})
    internal_only = refused_names({Accept.TOKEN_ENDPOINTS})
    assert "/generative_scoring" in token_only
    assert "/flush_cache" not in token_only
    assert "/flush_cache" in internal_only
    assert "/generative_scoring" not in internal_only
    assert refused_names({Accept.TOKEN_ENDPOINTS, Accept.INTERNAL_ENDPOINTS}) == ()
    assert route_regex("/v1/", None, ()) is None
    # Under an inference segment: answered before every route, whatever it accepts.
    assert "/inference/v1/abort_requests" not in ALL


# Routes a platform's operator may write: their rewrites change the path's root only.
PLATFORM_ROUTES = [("/", None), ("/v1/", None), ("/pd/v1/", "/v1/"), ("/a/b/", "/c/"), ("/d/", "/")]


@settings(max_examples=400, deadline=None)
@given(
    route=st.sampled_from(PLATFORM_ROUTES),
    refused=st.sampled_from(list(refused_paths.ANYWHERE_ROUTES.values())),
    before=st.lists(SEGMENT, max_size=3),
    name=NAMES,
    upper=st.booleans(),
    tail=TAILS,
)
def test_a_class_regex_answers_what_a_route_refusing_only_that_class_refuses(
    route, refused, before, name, upper, tail
):
    # Before every route of a table it does not know: whatever the route, a path whose
    # upstream is one of the class's endpoints matches, and no other does.
    prefix, rewrite = route
    regex = refused_paths.anywhere_regex(refused_paths.class_names(refused))
    path = prefix + "".join(f"{s}/" for s in before) + spell(name, upper)[1:] + tail
    others = frozenset(Accept) - {refused}
    found = compile_re2(regex).fullmatch(path.partition("?")[0]) is not None
    assert found is judged(prefix, rewrite, path, others), path


def test_the_class_regexes_together_are_a_root_routes():
    # Every refused endpoint in exactly one class; the regex of a "/" route refusing
    # both, the one the llm-d chart's catch-all has.
    token, internal = (refused_paths.class_names(c) for c in refused_paths.ANYWHERE_ROUTES.values())
    assert set(token).isdisjoint(internal)
    assert sorted((*token, *internal)) == sorted(ALL)
    assert refused_paths.anywhere_regex(ALL) == route_regex("/", None, ALL)
    with pytest.raises(ValueError, match="no endpoint names"):
        refused_paths.anywhere_regex(())


def test_every_regex_fits_the_program_size_the_bootstraps_allow():
    # The shipped configs' regexes, and the worst of the routes above.
    sizes = [refused_paths.program_size(route_regex(p, r, ALL) or "") for p, r in ROUTES]
    for path in SHIPPED:
        text = path.read_text()
        config = yaml.safe_load(text)
        found = [
            route["match"]["safe_regex"]["regex"]
            for route in _routes(config)
            if route.get("name", "").endswith("-refused")
        ]
        assert found, path.name
        sizes += [refused_paths.program_size(regex) for regex in found]
        layers = config["layered_runtime"]["layers"]
        assert layers[0]["static_layer"] == {
            refused_paths.PROGRAM_SIZE_RUNTIME_KEY: PROGRAM_SIZE_LIMIT
        }
    sizes += [
        refused_paths.program_size(refused_paths.anywhere_regex(refused_paths.class_names(c)))
        for c in refused_paths.ANYWHERE_ROUTES.values()
    ]
    # Room for the classification to grow, and a limit that still means something.
    assert max(sizes) * 2 < PROGRAM_SIZE_LIMIT


def _routes(config):
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network in chain["filters"]:
                manager = network.get("typed_config", {})
                for vhost in manager.get("route_config", {}).get("virtual_hosts", []):
                    yield from vhost["routes"]
