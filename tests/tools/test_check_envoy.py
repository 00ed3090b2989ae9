import copy
from pathlib import Path

import pytest
import yaml

from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy import check, main

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "envoy"
SHIPPED = yaml.safe_load((SHIPPED_DIR / "envoy.yaml").read_text())


def hcm(config):
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]


EXT_PROC = "envoy.filters.http.ext_proc"


def ext_proc_index(config):
    return [f["name"] for f in hcm(config)["http_filters"]].index(EXT_PROC)


def ext_proc(config):
    return hcm(config)["http_filters"][ext_proc_index(config)]["typed_config"]


def routes(config):
    return hcm(config)["route_config"]["virtual_hosts"][0]["routes"]


def route(config, name):
    (found,) = [r for r in routes(config) if r["name"] == name]
    return found


def policy(config, name):
    return route(config, name)["metadata"]["filter_metadata"]["ext_proc.token_policy"]


def mint_mode(config):
    per_route = route(config, "prefill")["typed_per_filter_config"]["envoy.filters.http.ext_proc"]
    return per_route["overrides"]["processing_mode"]


PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"


def per_route(**config):
    return {"envoy.filters.http.ext_proc": {"@type": PER_ROUTE, **config}}


def test_shipped_config_is_clean():
    report = check(SHIPPED)
    assert (report.errors, report.warnings, report.routes) == ([], [], 8)
    # Among them: a mint route, an honor route, and direct responses without metadata
    # or the filter (the token endpoints), none of which is reported.
    assert policy(SHIPPED, "prefill")["action"] == "mint"
    assert policy(SHIPPED, "disaggregated")["action"] == "honor"
    direct = [r for r in routes(SHIPPED) if "direct_response" in r]
    assert len(direct) == 4
    assert all("metadata" not in r and "typed_per_filter_config" in r for r in direct)


@pytest.mark.parametrize("path", sorted(SHIPPED_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_clean(path):
    report = check(yaml.safe_load(path.read_text()))
    assert (report.errors, report.warnings) == ([], [])


def mutated(change):
    config = copy.deepcopy(SHIPPED)
    change(config)
    return check(config)


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda c: ext_proc(c).update(failure_mode_allow=True), "failure_mode_allow"),
        (lambda c: ext_proc(c).update(observability_mode=True), "observability_mode"),
        (lambda c: ext_proc(c).update(allow_content_length_header=True), "content_length"),
        (lambda c: ext_proc(c)["processing_mode"].update(request_body_mode="STREAMED"), "STREAMED"),
        (lambda c: ext_proc(c)["request_attributes"].pop(), "SKIP needs"),
        (
            lambda c: ext_proc(c)["processing_mode"].update(
                request_body_mode="FULL_DUPLEX_STREAMED", request_trailer_mode="SKIP"
            ),
            "request_trailer_mode SEND",
        ),
        (lambda c: ext_proc(c)["request_attributes"].pop(0), "request_attributes lacks"),
        (
            lambda c: policy(c, "disaggregated").update(action="allow"),
            "ext_proc.token_policy.action",
        ),
        (
            lambda c: policy(c, "disaggregated").update(topolgy="aggregated"),
            "allowed fields",
        ),
        (
            lambda c: policy(c, "disaggregated").update(vocab_size=1.5),
            "vocab_size",
        ),
        (
            lambda c: route(c, "aggregated").update(
                typed_per_filter_config={
                    "envoy.filters.http.ext_proc": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3."
                        "ExtProcPerRoute",
                        "overrides": {"failure_mode_allow": True},
                    }
                }
            ),
            "fails open",
        ),
        (lambda c: hcm(c)["http_filters"].pop(ext_proc_index(c)), "no ext_proc filter"),
        # A mint route whose response the processor never sees signs nothing.
        (
            lambda c: route(c, "prefill").pop("typed_per_filter_config"),
            "response is not processed",
        ),
        (lambda c: mint_mode(c).update(response_body_mode="NONE"), "response is not processed"),
        (
            lambda c: mint_mode(c).update(response_body_mode="STREAMED"),
            "response is not processed",
        ),
        (lambda c: mint_mode(c).pop("response_header_mode"), "response is not processed"),
        (
            lambda c: route(c, "prefill").update(typed_per_filter_config=per_route(disabled=True)),
            "response is not processed",
        ),
        # The override replaces the filter's whole mode: its request side is checked too.
        (lambda c: mint_mode(c).pop("request_body_mode"), "request_body_mode NONE"),
        # Overrides that fail open, wherever they sit, also inside a FilterConfig.
        (
            lambda c: route(c, "aggregated").update(
                typed_per_filter_config={
                    "envoy.filters.http.ext_proc": {
                        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                        "config": per_route(overrides={"failure_mode_allow": True})[
                            "envoy.filters.http.ext_proc"
                        ],
                    }
                }
            ),
            "aggregated: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
        (
            lambda c: route(c, "prefill").update(
                typed_per_filter_config={
                    "envoy.filters.http.ext_proc": {
                        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                        "disabled": True,
                    }
                }
            ),
            "response is not processed",
        ),
        (
            lambda c: route(c, "prefill")["typed_per_filter_config"]["envoy.filters.http.ext_proc"][
                "overrides"
            ].update(failure_mode_allow=True),
            "fails open",
        ),
        (
            lambda c: hcm(c)["route_config"]["virtual_hosts"][0].update(
                typed_per_filter_config=per_route(overrides={"failure_mode_allow": True})
            ),
            "virtual_host vllm: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
        (
            lambda c: hcm(c)["route_config"].update(
                typed_per_filter_config=per_route(overrides={"failure_mode_allow": True})
            ),
            "route_config: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
        (
            lambda c: route(c, "aggregated")["route"].update(
                weighted_clusters={
                    "clusters": [
                        {
                            "name": "aggregated",
                            "weight": 1,
                            "typed_per_filter_config": per_route(
                                overrides={"failure_mode_allow": True}
                            ),
                        }
                    ]
                }
            ),
            "aggregated: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
    ],
)
def test_problems_are_errors(change, text):
    report = mutated(change)
    assert any(text in error for error in report.errors), report.errors


def test_route_without_metadata_is_a_warning():
    (warning,) = warnings_of(lambda c: route(c, "disaggregated").pop("metadata"))
    assert "route vllm/disaggregated: no 'ext_proc.token_policy' metadata" in warning


NOT_INSPECTED = "no ext_proc filter runs on this forwarding route"


@pytest.mark.parametrize(
    "disable",
    [
        lambda r: r.update(typed_per_filter_config=per_route(disabled=True)),
        # The same through a FilterConfig wrapper.
        lambda r: r.update(
            typed_per_filter_config={
                "envoy.filters.http.ext_proc": {
                    "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                    "disabled": True,
                }
            }
        ),
    ],
    ids=["ExtProcPerRoute", "FilterConfig"],
)
def test_a_forwarding_route_without_the_filter_is_an_error(disable, tmp_path, capsys):
    # Its bodies, client-chosen ids included, would reach the upstream uninspected: the
    # check fails (exit 1), it does not merely warn.
    def change(config):
        disable(route(config, "aggregated"))

    report = mutated(change)
    (error,) = report.errors
    assert error.startswith("http_connection_manager[0] route vllm/aggregated: " + NOT_INSPECTED)
    assert "direct_response" in error
    assert not any(NOT_INSPECTED in w for w in report.warnings)
    config = copy.deepcopy(SHIPPED)
    change(config)
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(path) == 1
    out = capsys.readouterr().out
    assert (
        f"error[ext-proc-not-running]: http_connection_manager[0] route vllm/aggregated: "
        f"{NOT_INSPECTED}"
    ) in out
    assert "FAILED" in out


def test_a_route_that_forwards_nothing_needs_no_filter():
    # The shipped token endpoints are direct responses with the filter disabled; a
    # redirect forwards nothing either.
    def change(config):
        entry = route(config, "aggregated")
        del entry["route"]
        entry["redirect"] = {"path_redirect": "/v1/"}
        entry["typed_per_filter_config"] = per_route(disabled=True)

    assert mutated(change).errors == []


def test_a_filter_disabled_by_default_runs_only_where_a_route_enables_it():
    # Envoy Gateway's pattern: every ext_proc filter is added disabled and enabled per
    # route, here through a FilterConfig wrapper.
    def enable_everywhere(config):
        hcm(config)["http_filters"][ext_proc_index(config)]["disabled"] = True
        for entry in hcm(config)["route_config"]["virtual_hosts"][0]["routes"]:
            if "route" not in entry:
                continue
            own = entry.setdefault("typed_per_filter_config", {})
            inner = own.get("envoy.filters.http.ext_proc")
            wrapper = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig"}
            if inner is not None:
                wrapper["config"] = inner
            own["envoy.filters.http.ext_proc"] = wrapper

    assert mutated(enable_everywhere).errors == []
    assert mutated(enable_everywhere).warnings == []

    def enable_nowhere(config):
        hcm(config)["http_filters"][ext_proc_index(config)]["disabled"] = True
        for entry in hcm(config)["route_config"]["virtual_hosts"][0]["routes"]:
            entry.pop("typed_per_filter_config", None)

    report = mutated(enable_nowhere)
    assert {e.split(": ")[0] for e in report.errors if NOT_INSPECTED in e} == {
        f"http_connection_manager[0] route vllm/{name}"
        for name in ("prefill", "disaggregated", "aggregated", "default")
    }
    # ... and a mint route that no filter runs on signs nothing.
    assert any("response is not processed" in e for e in report.errors)


def warnings_of(change):
    report = mutated(change)
    assert report.errors == []
    return report.warnings


def test_honor_route_trusting_any_caller_is_a_warning():
    (warning,) = warnings_of(lambda c: policy(c, "disaggregated").update(trust_any_caller=True))
    assert "route vllm/disaggregated: trust_any_caller honors ids from any caller" in warning
    assert "only for routes nothing untrusted can reach" in warning


def test_honor_route_without_vocab_size_is_a_warning():
    (warning,) = warnings_of(lambda c: policy(c, "disaggregated").pop("vocab_size"))
    assert "route vllm/disaggregated: honor without vocab_size" in warning
    # A mint route needs none: what it honors is only what honor routes check again.
    assert warnings_of(lambda c: policy(c, "prefill").pop("vocab_size")) == []


def test_mint_route_may_take_the_response_mode_from_the_filter():
    def change(config):
        route(config, "prefill").pop("typed_per_filter_config")
        ext_proc(config)["processing_mode"].update(
            response_header_mode="SEND", response_body_mode="BUFFERED"
        )

    assert warnings_of(change) == []


def test_mint_route_may_take_the_response_mode_from_its_virtual_host():
    def change(config):
        overrides = route(config, "prefill").pop("typed_per_filter_config")
        hcm(config)["route_config"]["virtual_hosts"][0]["typed_per_filter_config"] = overrides

    assert warnings_of(change) == []


def test_a_route_disabling_the_filter_wins_over_its_virtual_host():
    def change(config):
        overrides = route(config, "prefill")["typed_per_filter_config"]
        hcm(config)["route_config"]["virtual_hosts"][0]["typed_per_filter_config"] = overrides
        route(config, "prefill")["typed_per_filter_config"] = per_route(disabled=True)

    report = mutated(change)
    assert any("prefill: action mint but the response is not processed" in e for e in report.errors)


def test_a_forwarding_route_is_reported_where_a_direct_response_is_not():
    def change(config):
        token_route = route(config, "token-endpoint-render")
        token_route["route"] = {"cluster": "aggregated"}
        del token_route["direct_response"]

    report = mutated(change)
    (error,) = report.errors
    assert "token-endpoint-render" in error
    assert NOT_INSPECTED in error
    (warning,) = report.warnings
    assert "token-endpoint-render: no 'ext_proc.token_policy' metadata" in warning


# --- a route's rewrite, as the processor must know it ---------------------------------------


def test_mint_and_honor_routes_must_state_their_rewrite():
    def unstated(name):
        def change(config):
            for key in ("match_prefix", "prefix_rewrite"):
                policy(config, name).pop(key)

        return change

    (error,) = mutated(unstated("prefill")).errors
    assert error == (
        "http_connection_manager[0] route vllm/prefill: the route rewrites '/pd/prefill/v1/' "
        "to '/v1/' but its metadata lacks match_prefix '/pd/prefill/v1/' and prefix_rewrite "
        "'/v1/'; the processor would take the downstream path for the upstream one and "
        "bind proofs to the wrong endpoint"
    )
    (error,) = mutated(unstated("disaggregated")).errors
    assert "vllm/disaggregated: the route rewrites '/pd/v1/' to '/v1/'" in error


@pytest.mark.parametrize(
    ("fields", "rewrite"),
    [
        ({"match_prefix": "/pd/", "prefix_rewrite": "/"}, "/v1/"),
        ({"match_prefix": "/pd/v1/", "prefix_rewrite": "/v1/"}, "/v2/"),
    ],
)
def test_a_stated_rewrite_must_be_the_routes(fields, rewrite):
    def change(config):
        policy(config, "disaggregated").update(fields)
        route(config, "disaggregated")["route"]["prefix_rewrite"] = rewrite

    (error,) = mutated(change).errors
    assert "vllm/disaggregated: metadata match_prefix" in error
    assert f"differ from the route's match_prefix '/pd/v1/' and prefix_rewrite {rewrite!r}" in error


def test_a_stated_rewrite_the_route_does_not_make_is_an_error():
    def change(config):
        policy(config, "aggregated").update(match_prefix="/v1/", prefix_rewrite="/v2/")

    (error,) = mutated(change).errors
    assert (
        "vllm/aggregated: metadata match_prefix '/v1/' and prefix_rewrite '/v2/' describe" in error
    )


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (
            lambda r: r["route"].update(
                regex_rewrite={"pattern": {"regex": "^/pd/v1/"}, "substitution": "/v1/"}
            ),
            "regex_rewrite is not supported",
        ),
        (
            lambda r: r.update(match={"path": "/pd/v1/chat/completions"}),
            "prefix_rewrite with a path matcher is not supported on a honor route",
        ),
        (
            lambda r: r.update(match={"safe_regex": {"regex": "/pd/v1/.*"}}),
            "prefix_rewrite with a safe_regex matcher is not supported on a honor route",
        ),
    ],
)
def test_rewrites_the_processor_cannot_follow_are_errors(change, text):
    def mutate(config):
        entry = route(config, "disaggregated")
        change(entry)
        if "regex_rewrite" in entry["route"]:
            del entry["route"]["prefix_rewrite"]

    report = mutated(mutate)
    assert any(text in e for e in report.errors), report.errors


def test_a_strip_route_with_an_unstated_rewrite_is_a_warning():
    def change(config):
        route(config, "aggregated")["route"]["prefix_rewrite"] = "/v1/x/"

    (warning,) = warnings_of(change)
    assert (
        "vllm/aggregated: the route rewrites '/v1/' to '/v1/x/' but its metadata lacks" in warning
    )
    assert "bind proofs" not in warning


def test_a_path_separated_prefix_rewrite_is_followed():
    # As Envoy Gateway and Istio write a Gateway API PathPrefix and ReplacePrefixMatch.
    def change(config):
        entry = route(config, "disaggregated")
        entry["match"] = {"path_separated_prefix": "/pd/v1"}
        entry["route"]["prefix_rewrite"] = "/v1"
        policy(config, "disaggregated").update(match_prefix="/pd/v1", prefix_rewrite="/v1")

    assert warnings_of(change) == []


# --- no route forwards a token-in or echo endpoint ------------------------------------------


def without(*names):
    def change(config):
        entries = routes(config)
        entries[:] = [r for r in entries if r.get("name") not in names]

    return change


def forwarding_errors(report):
    """The errors of routes that forward a token endpoint, by route name."""
    return {
        e.split(": forwards ")[0].rsplit("/", 1)[1]: e for e in report.errors if ": forwards " in e
    }


def test_the_shipped_config_before_the_echo_route_forwarded_render_paths():
    # The 404s of the root prefixes alone: each policy route passes its own render and
    # derender paths to vLLM, rewritten.
    errors = forwarding_errors(mutated(without("token-endpoint-echo")))
    assert set(errors) == {"prefill", "disaggregated", "aggregated", "default"}
    assert errors["disaggregated"].startswith(
        "http_connection_manager[0] route vllm/disaggregated: forwards "
        "'/pd/v1/chat/completions/render' (upstream '/v1/chat/completions/render', made "
        "from route disaggregated) and "
    )
    assert "to a vLLM token-in or echo endpoint" in errors["disaggregated"]
    assert "'/pd/prefill/v1/chat/completions/render'" in errors["prefill"]


@pytest.mark.parametrize(
    ("regex", "probe"),
    [
        # Case-sensitive: upper-case spellings pass.
        (".*/(de)?render/?(%0[aA])?", "/pd/prefill/v1/CHAT/COMPLETIONS/RENDER"),
        # No trailing slash, no escaped newline, no derender.
        ("(?i).*/(de)?render(%0a)?", "/pd/prefill/v1/chat/completions/render/"),
        ("(?i).*/(de)?render/?", "/pd/prefill/v1/chat/completions/render%0A"),
        ("(?i).*/render/?(%0a)?", "/pd/prefill/v1/chat/completions/derender"),
    ],
)
def test_a_narrower_echo_route_is_caught(regex, probe):
    def change(config):
        route(config, "token-endpoint-echo")["match"]["safe_regex"]["regex"] = regex

    errors = forwarding_errors(mutated(change))
    assert f"route vllm/prefill: forwards {probe!r} (upstream " in errors["prefill"], errors


def test_case_variants_are_probed():
    def change(config):
        route(config, "token-endpoint-echo")["match"]["safe_regex"]["regex"] = ".*/(de)?render/?"

    errors = forwarding_errors(mutated(change))
    assert "'/V1/CHAT/COMPLETIONS/RENDER'" in errors["default"]


def test_the_token_in_api_is_probed():
    # At the root and behind a root path (vLLM's --root-path) under every route.
    errors = forwarding_errors(mutated(without("token-endpoint-inference")))
    assert set(errors) == {"prefill", "disaggregated", "aggregated", "default"}
    assert (
        "forwards '/inference/v1/generate' (upstream '/inference/v1/generate'" in errors["default"]
    )
    assert (
        "forwards '/pd/v1/inference/v1/generate' (upstream '/v1/inference/v1/generate'"
        in errors["disaggregated"]
    )


def test_the_first_matching_route_decides():
    def last(config):
        entries = routes(config)
        echo = route(config, "token-endpoint-echo")
        entries.remove(echo)
        entries.append(echo)

    assert set(forwarding_errors(mutated(last))) == {
        "prefill",
        "disaggregated",
        "aggregated",
        "default",
    }


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
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="pd-root", match={"prefix": prefix})
        entry["route"]["prefix_rewrite"] = rewrite
        policy_fields = entry["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        policy_fields.update(match_prefix=prefix, prefix_rewrite=rewrite)
        routes(config).insert(4, entry)

    errors = forwarding_errors(mutated(change))
    assert set(errors) == {"pd-root"}
    assert f"forwards {probe!r} (upstream {upstream!r}" in errors["pd-root"]


def test_a_route_rewritten_behind_a_root_path_is_answered_by_the_regex():
    # /pd/inference/v1/generate reaches /inference/v1/generate, and the 404 of an
    # inference segment behind any prefix answers it before the route.
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="pd-root", match={"prefix": "/pd/"})
        entry["route"]["prefix_rewrite"] = "/"
        policy_fields = entry["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        policy_fields.update(match_prefix="/pd/", prefix_rewrite="/")
        routes(config).insert(4, entry)

    assert mutated(change).errors == []


def test_a_conditional_404_does_not_count_and_a_conditional_route_may_forward():
    def conditional_404(config):
        route(config, "token-endpoint-echo")["match"]["headers"] = [
            {"name": "x-block", "present_match": True}
        ]

    assert "disaggregated" in forwarding_errors(mutated(conditional_404))

    def conditional_route(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="by-header", match={"prefix": "/", "headers": [{"name": "x-a"}]})
        routes(config).insert(0, entry)

    errors = forwarding_errors(mutated(conditional_route))
    assert set(errors) == {"by-header"}
    assert "if its matcher matches" in errors["by-header"]


def test_a_path_separated_prefix_route_is_probed():
    def change(config):
        without("token-endpoint-echo")(config)
        entry = route(config, "disaggregated")
        entry["match"] = {"path_separated_prefix": "/pd/v1"}
        entry["route"]["prefix_rewrite"] = "/v1"
        policy(config, "disaggregated").update(match_prefix="/pd/v1", prefix_rewrite="/v1")

    assert (
        "forwards '/pd/v1/chat/completions/render' (upstream '/v1/chat/completions/render'"
        in (forwarding_errors(mutated(change))["disaggregated"])
    )


@pytest.mark.parametrize("path", sorted(SHIPPED_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_the_configs_shipped_before_the_echo_route_fail(path):
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
    assert set(forwarding_errors(check(config))) >= binding


# --- the routes the end-to-end stack adds ----------------------------------------------------


def test_the_end_to_end_stacks_routes_state_their_own_rewrites():
    # tests/e2e/stack.py puts test routes before the shipped forwarding ones, after the
    # token endpoint 404s: each states its own prefix and rewrite.
    from tests.e2e import stack  # noqa: PLC0415 - the end-to-end helpers, not needed above

    config = copy.deepcopy(SHIPPED)
    added = stack.extra_routes()
    stack.add_routes(routes(config), added)
    for entry in added:
        fields = entry.get("metadata", {}).get("filter_metadata", {}).get("ext_proc.token_policy")
        if fields is not None:
            assert fields["match_prefix"] == entry["match"]["prefix"], entry["name"]
            assert fields["prefix_rewrite"] == entry["route"]["prefix_rewrite"], entry["name"]
    # Only the routes whose metadata is invalid on purpose (bad-*) are errors.
    report = check(config)
    assert [e for e in report.errors if "invalid route policy metadata" not in e] == []


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda m: m.pop("normalize_path"), "normalize_path is not true"),
        (lambda m: m.update(normalize_path=False), "normalize_path is not true"),
        (
            lambda m: m.pop("path_with_escaped_slashes_action"),
            "path_with_escaped_slashes_action KEEP_UNCHANGED keeps '%2F'",
        ),
        (
            lambda m: m.update(path_with_escaped_slashes_action="KEEP_UNCHANGED"),
            "path_with_escaped_slashes_action KEEP_UNCHANGED keeps '%2F'",
        ),
    ],
)
def test_route_matches_must_see_the_path_the_upstream_decodes(change, text):
    (error,) = mutated(lambda c: change(hcm(c))).errors
    assert error.startswith(f"http_connection_manager[0]: {text}")


@pytest.mark.parametrize("action", ["UNESCAPE_AND_FORWARD", "REJECT_REQUEST"])
def test_escaped_slashes_may_also_be_forwarded_unescaped_or_refused(action):
    assert mutated(lambda c: hcm(c).update(path_with_escaped_slashes_action=action)).errors == []


@pytest.mark.parametrize("name", ["aggregated", "disaggregated"])
def test_a_regex_rewrite_is_an_error_on_any_forwarding_route(name):
    # Nobody can tell where it sends a path: /legacy/inference/v1/generate, say.
    def change(config):
        entry = route(config, name)
        entry["route"].pop("prefix_rewrite", None)
        entry["route"]["regex_rewrite"] = {
            "pattern": {"regex": "^/legacy/"},
            "substitution": "/",
        }

    report = mutated(change)
    assert any(f"vllm/{name}: regex_rewrite is not supported" in e for e in report.errors), (
        report.errors
    )


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

    report = mutated(change)
    (error,) = [e for e in report.errors if "vllm/escaped" in e]
    assert f"forwards {probe!r}" in error


def test_a_weighted_cluster_that_disables_the_filter_is_an_error():
    def change(config):
        entry = route(config, "aggregated")
        cluster = entry["route"].pop("cluster")
        entry["route"]["weighted_clusters"] = {
            "clusters": [
                {"name": cluster, "weight": 50},
                {
                    "name": cluster,
                    "weight": 50,
                    "typed_per_filter_config": {
                        "envoy.filters.http.ext_proc": {"@type": PER_ROUTE, "disabled": True}
                    },
                },
            ]
        }

    report = mutated(change)
    assert any("weighted cluster" in e for e in report.errors), report.errors


def test_routes_this_check_cannot_see_are_errors():
    def rds(config):
        manager = hcm(config)
        manager.pop("route_config")
        manager["rds"] = {"route_config_name": "r", "config_source": {"ads": {}}}

    assert any("routes come from rds" in e for e in mutated(rds).errors)

    def matcher(config):
        (vhost,) = hcm(config)["route_config"]["virtual_hosts"]
        vhost["matcher"] = {"matcher_tree": {}}

    assert any("matcher tree" in e for e in mutated(matcher).errors)


# --- routes the check could not see (an audit's six edits of envoy/envoy.yaml) -------------
# Each passed the check before it read every matcher with RE2 and failed closed on what it
# cannot evaluate; on the real Envoy the first three forward token endpoints
# (tests/e2e/test_live_probe.py sends them), the last three fail only at run time.


def forwarding_first(regex):
    """A forwarding route matched by ``regex``, before the token endpoint 404s."""

    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="edit", match={"safe_regex": {"regex": regex}})
        routes(config).insert(0, entry)

    return change


def per_route_under_the_types_name(config):
    # The 404s' disable keyed by the filter's type: Envoy looks per-route configs up by
    # the filter's name only, so the processor still runs on them.
    entry = route(config, "token-endpoint-echo")
    configs = entry["typed_per_filter_config"]
    configs[EXT_PROC_TYPE.removeprefix("type.googleapis.com/")] = configs.pop(EXT_PROC)


def an_upgrade_chain(config):
    manager = hcm(config)
    manager["upgrade_configs"] = [
        {"upgrade_type": "websocket", "filters": [copy.deepcopy(manager["http_filters"][-1])]}
    ]


SIX_EDITS = {
    # A catch-all for vLLM under --root-path /api: no probe is made from a regex.
    "regex-catch-all": (forwarding_first("/api/.*"), "forwards what its safe_regex '/api/.*'"),
    "case-insensitive-regex": (
        forwarding_first("(?i)/v2/.*"),
        "forwards what its safe_regex '(?i)/v2/.*'",
    ),
    # Python's re reads "[[:alpha:]]" as a nested set and matches no probe; RE2 forwards
    # /inference/v1/generate.
    "posix-class": (
        forwarding_first("/[[:alpha:]]+/.*"),
        "route vllm/edit: forwards '/render/' (upstream '/render/'",
    ),
    "per-route-disable-under-the-types-name": (
        per_route_under_the_types_name,
        "typed_per_filter_config 'envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor'"
        " names no filter of the chain",
    ),
    "disable-immediate-response": (
        lambda c: ext_proc(c).update(disable_immediate_response=True),
        "disable_immediate_response drops the processor's refusals",
    ),
    "upgrade-filter-chain": (an_upgrade_chain, "upgrade_configs 'websocket' runs filters"),
}


@pytest.mark.parametrize("edit", SIX_EDITS)
def test_the_six_edits_fail_the_check(edit):
    change, text = SIX_EDITS[edit]
    errors = mutated(change).errors
    assert any(text in e for e in errors), errors


def test_a_pattern_route_after_the_404s_passes():
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="api", match={"safe_regex": {"regex": "/api/.*"}})
        listed = routes(config)
        listed.insert(next(i for i, r in enumerate(listed) if "route" in r), entry)

    assert mutated(change).errors == []


def test_a_regex_re2_cannot_compile_is_an_error():
    def change(config):
        route(config, "token-endpoint-render")["match"] = {"safe_regex": {"regex": "(?<=x)/"}}

    errors = mutated(change).errors
    assert any("vllm/token-endpoint-render: RE2 cannot compile '(?<=x)/'" in e for e in errors), (
        errors
    )


def test_a_404_that_python_reads_wider_than_re2_is_caught():
    # Python's re takes "{,4096}" for a repetition; RE2 for the literal text, so this 404
    # answers nothing on Envoy and the render paths pass.
    def change(config):
        regex = "(?i).{,4096}/(de)?render/?(%0a)?"
        route(config, "token-endpoint-echo")["match"]["safe_regex"]["regex"] = regex

    assert "aggregated" in forwarding_errors(mutated(change))


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

    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="tmpl", match=template)
        routes(config).insert(0, entry)

    errors = forwarding_errors(mutated(change))
    # Before the 404s it takes what the probes send ("**" matches the empty rest too).
    assert "forwards '/render/' (upstream '/render/'" in errors["tmpl"]
    template["path_match_policy"]["typed_config"]["path_template"] = "/{api}.json"
    errors = mutated(change).errors
    assert any("vllm/tmpl: URI template segment '{api}.json'" in e for e in errors), errors


def test_a_case_insensitive_prefix_before_the_404s_is_probed_in_every_case():
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="ci", match={"prefix": "/API/", "case_sensitive": False})
        routes(config).insert(0, entry)

    errors = forwarding_errors(mutated(change))
    assert "forwards '/API/inference/v1/generate'" in errors["ci"]


def test_a_regex_rewrite_is_evaluated_with_re2_where_it_is_selected():
    # Still an error (no probe can be made from it), and its upstream is RE2's.
    def change(config):
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name="legacy", match={"prefix": "/legacy/"})
        entry["route"]["regex_rewrite"] = {
            "pattern": {"regex": "^/legacy/[[:alpha:]]*"},
            "substitution": "/inference",
        }
        routes(config).insert(0, entry)

    errors = mutated(change).errors
    assert any("vllm/legacy: regex_rewrite is not supported" in e for e in errors), errors
    assert "(upstream '/inference/" in forwarding_errors(mutated(change))["legacy"]


# --- the request held until the decision (one message) -----------------------------------

BUFFER = "envoy.filters.http.buffer"
BUFFER_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute"
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
HELD = "skips the request headers (one message)"


def filter_names(config):
    return [f["name"] for f in hcm(config)["http_filters"]]


def after_hold(config):
    return filter_names(config).index(BUFFER) + 1


def _move_hold_before_ext_proc(config):
    filters = hcm(config)["http_filters"]
    filters.insert(0, filters.pop(filter_names(config).index(BUFFER)))


def _hold(config, name, value):
    route(config, name)["typed_per_filter_config"][BUFFER] = value


@pytest.mark.parametrize(
    ("change", "routes_held"),
    [
        # No buffer filter: every forwarding route opens the upstream before the decision.
        (lambda c: hcm(c)["http_filters"].pop(filter_names(c).index(BUFFER)), []),
        # Before ext_proc it holds the request for nothing: ext_proc still passes the
        # headers on to the router first.
        (_move_hold_before_ext_proc, []),
        # Off on one route, by its own settings or a FilterConfig wrapper.
        (
            lambda c: _hold(c, "aggregated", {"@type": BUFFER_PER_ROUTE, "disabled": True}),
            ["prefill", "disaggregated", "default"],
        ),
        (
            lambda c: _hold(c, "default", {"@type": FILTER_CONFIG, "disabled": True}),
            ["prefill", "disaggregated", "aggregated"],
        ),
        # Off by default and not enabled on the routes.
        (
            lambda c: [
                hcm(c)["http_filters"][filter_names(c).index(BUFFER)].update(disabled=True),
                [r.get("typed_per_filter_config", {}).pop(BUFFER, None) for r in routes(c)],
            ],
            [],
        ),
    ],
    ids=["absent", "before-ext-proc", "off-on-a-route", "off-by-wrapper", "off-by-default"],
)
def test_one_message_without_a_hold_is_an_error(change, routes_held):
    report = mutated(change)
    unheld = {e.split("route vllm/")[1].split(":")[0] for e in report.errors if HELD in e}
    forwarding = {r["name"] for r in routes(SHIPPED) if "route" in r}
    assert unheld == forwarding - set(routes_held)
    assert len(report.errors) == len(unheld)


def test_a_hold_enabled_by_an_empty_wrapper_counts():
    def change(config):
        hcm(config)["http_filters"][filter_names(config).index(BUFFER)]["disabled"] = True
        for entry in routes(config):
            if "route" in entry:
                entry["typed_per_filter_config"][BUFFER] = {"@type": FILTER_CONFIG}

    report = mutated(change)
    assert report.errors == []
    # The filter's own max_request_bytes then replaces each route's limit: equal here.
    assert report.warnings == []


def _hold_limit(limit):
    return lambda c: _hold(
        c, "aggregated", {"@type": BUFFER_PER_ROUTE, "buffer": {"max_request_bytes": limit}}
    )


def test_a_hold_below_the_routes_limit_is_a_warning():
    report = mutated(_hold_limit(1024))
    assert report.errors == []
    (warning,) = report.warnings
    assert "vllm/aggregated" in warning
    assert "max_request_bytes 1024 lowers this route's request_body_buffer_limit" in warning


def test_a_hold_above_the_routes_limit_is_an_error():
    # The hold sets the stream's limit: Envoy would buffer a GiB where the route says 16 MiB.
    (error,) = mutated(_hold_limit(1 << 30)).errors
    assert "vllm/aggregated" in error
    assert f"max_request_bytes {1 << 30} raises this route's request_body_buffer_limit" in error


def test_a_hold_on_a_route_without_a_limit_is_an_error():
    (error,) = mutated(lambda c: route(c, "aggregated").pop("request_body_buffer_limit")).errors
    assert "vllm/aggregated" in error
    assert "the route states none" in error


def weighted(config, name, inner):
    """Route ``name`` split over one weighted cluster with ``inner`` as its own
    typed_per_filter_config."""
    action = route(config, name)["route"]
    cluster = action.pop("cluster")
    action["weighted_clusters"] = {
        "clusters": [{"name": cluster, "weight": 1, "typed_per_filter_config": inner}]
    }


def test_a_weighted_cluster_that_turns_the_hold_off_is_an_error():
    off = {BUFFER: {"@type": BUFFER_PER_ROUTE, "disabled": True}}
    (error,) = mutated(lambda c: weighted(c, "disaggregated", off)).errors
    assert "vllm/disaggregated weighted cluster 'disaggregated'" in error
    assert HELD in error


def test_a_weighted_cluster_that_raises_the_limit_is_an_error():
    raised = {BUFFER: {"@type": BUFFER_PER_ROUTE, "buffer": {"max_request_bytes": 1 << 30}}}
    (error,) = mutated(lambda c: weighted(c, "disaggregated", raised)).errors
    assert "weighted cluster 'disaggregated'" in error
    assert "raises this route's request_body_buffer_limit" in error


def test_two_messages_need_no_hold():
    two = yaml.safe_load((SHIPPED_DIR / "envoy-two-message.yaml").read_text())
    assert BUFFER not in filter_names(two)
    assert check(two).errors == []
    # A route that overrides the mode to one message needs one.
    mode = route(two, "aggregated").setdefault("typed_per_filter_config", {})
    mode["envoy.filters.http.ext_proc"] = {
        "@type": PER_ROUTE,
        "overrides": {
            "processing_mode": {
                **ext_proc(two)["processing_mode"],
                "request_header_mode": "SKIP",
            }
        },
    }
    ext_proc(two)["request_attributes"] = ext_proc(SHIPPED)["request_attributes"]
    errors = check(two).errors
    assert len(errors) == 1
    assert "vllm/aggregated" in errors[0]
    assert HELD in errors[0]


# --- other ext_proc filters, and listeners named -------------------------------------------

EXT_PROC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
# An endpoint picker's filter: another service, failing open, none of our attributes.
PICKER = {
    "name": "picker",
    "typed_config": {
        "@type": EXT_PROC_TYPE,
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
        "failure_mode_allow": True,
        "processing_mode": {"request_body_mode": "FULL_DUPLEX_STREAMED"},
    },
}


def test_another_services_ext_proc_filter_after_the_hold_is_left_to_its_service():
    report = mutated(lambda c: hcm(c)["http_filters"].insert(after_hold(c), copy.deepcopy(PICKER)))
    assert report.errors == []
    # Failing open is its own service's business, but worth saying.
    (warning,) = report.warnings
    assert "ext_proc filter picker fails open" in warning
    closed = copy.deepcopy(PICKER)
    closed["typed_config"]["failure_mode_allow"] = False
    report = mutated(lambda c: hcm(c)["http_filters"].insert(after_hold(c), closed))
    assert (report.errors, report.warnings) == ([], [])


@pytest.mark.parametrize(
    ("position", "text"),
    [(EXT_PROC, "runs before this processor's"), (BUFFER, "runs before the buffer filter")],
    ids=["before-ours", "before-the-hold"],
)
def test_another_services_filter_before_the_decision_is_an_error(position, text):
    closed = copy.deepcopy(PICKER)
    closed["typed_config"]["failure_mode_allow"] = False

    def change(config):
        hcm(config)["http_filters"].insert(filter_names(config).index(position), closed)

    (error,) = mutated(change).errors
    assert f"ext_proc filter picker {text}" in error


def test_a_filter_asking_only_for_generic_attributes_is_not_ours():
    # The route name and path are anyone's to ask for: only the route metadata fields
    # make a filter this processor's.
    picker = copy.deepcopy(PICKER)
    picker["typed_config"]["failure_mode_allow"] = False
    picker["typed_config"]["request_attributes"] = ["xds.route_name", "request.url_path"]
    report = mutated(lambda c: hcm(c)["http_filters"].insert(after_hold(c), picker))
    assert (report.errors, report.warnings) == ([], [])


def test_a_chain_with_only_another_services_filter_is_an_error():
    def change(config):
        filters = hcm(config)["http_filters"]
        filters[:] = [copy.deepcopy(PICKER), filters[-1]]

    (error,) = mutated(change).errors
    assert "no ext_proc filter of this processor" in error
    assert "though other ext_proc filters run" in error


def with_admin_listener(config):
    """A second listener that forwards Envoy's own stats, with no ext_proc filter."""
    listeners = config["static_resources"]["listeners"]
    admin = copy.deepcopy(listeners[0])
    admin["name"] = "stats"
    manager = admin["filter_chains"][0]["filters"][0]["typed_config"]
    manager["http_filters"] = [manager["http_filters"][-1]]
    listeners.append(admin)


def test_named_listeners_are_the_only_ones_checked():
    config = copy.deepcopy(SHIPPED)
    with_admin_listener(config)
    gateway = config["static_resources"]["listeners"][0]["name"]
    (error,) = check(config).errors
    assert error.startswith("http_connection_manager[1]: no ext_proc filter of this processor")
    assert check(config, listeners=frozenset({gateway})).errors == []
    assert check(config, listeners=frozenset({gateway, "nope"})).errors == [
        "no listener named nope"
    ]


def test_main_takes_listener_names(tmp_path, capsys):
    config = copy.deepcopy(SHIPPED)
    with_admin_listener(config)
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = config["static_resources"]["listeners"][0]["name"]
    assert main(path) == 1
    assert main(path, listeners=frozenset({gateway})) == 0
    assert "OK" in capsys.readouterr().out.splitlines()[-1]


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

    def change(config, with_phase):
        listed = routes(config)
        first = next(i for i, r in enumerate(listed) if "route" in r)
        listed[first:first] = [phase, rewrites] if with_phase else [rewrites]

    for with_phase in (False, True):
        errors = forwarding_errors(mutated(lambda c, w=with_phase: change(c, w)))
        assert "rewrites" in errors, (with_phase, errors)


# --- the header step (ext_proc.tools.carrier_headers) --------------------------------------------

STEP = carrier_headers.FILTER


def _step(config):
    return hcm(config)["http_filters"][filter_names(config).index(STEP)]


def _step_mutations(config):
    return _step(config)["typed_config"]["mutations"]["request_mutations"]


def _drop_removal(name):
    def change(config):
        mutations = _step_mutations(config)
        mutations[:] = [m for m in mutations if m.get("remove") != name]

    return change


def _request_id_kept(config):
    for mutation in _step_mutations(config):
        header = mutation.get("append", {}).get("header", {})
        if header.get("key") == carrier_headers.REQUEST_ID:
            header["value"] = "%REQ(x-request-id)%"


def _after_ours(config):
    filters = hcm(config)["http_filters"]
    filters.insert(ext_proc_index(config), filters.pop(filter_names(config).index(STEP)))


def _on_a_route(config):
    route(config, "aggregated")["typed_per_filter_config"][STEP] = {
        "@type": FILTER_CONFIG,
        "disabled": True,
    }


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda c: hcm(c)["http_filters"].pop(filter_names(c).index(STEP)), "no header step"),
        (_after_ours, "no header step"),
        (lambda c: _step(c).update(disabled=True), "it is disabled"),
        (_drop_removal("x-prefiller-host-port"), "keeps a client's x-prefiller-host-port"),
        (_drop_removal("x-worker-instance-id"), "keeps a client's x-worker-instance-id"),
        (_request_id_kept, "keeps a client's x-request-id"),
        (
            lambda c: _step(c)["typed_config"].update(most_specific_header_mutations_wins=True),
            "most_specific_header_mutations_wins",
        ),
        (_on_a_route, "configures the header step"),
    ],
    ids=[
        "absent",
        "after-ours",
        "disabled",
        "llm-d",
        "dynamo",
        "request-id",
        "route-wins",
        "route",
    ],
)
def test_a_chain_that_lets_a_client_header_through_is_an_error(change, text):
    (error,) = mutated(change).errors
    assert text in error


def test_the_shipped_header_step_removes_every_routing_header_and_renews_the_id():
    mutations = _step_mutations(SHIPPED)
    assert [m["remove"] for m in mutations if "remove" in m] == list(
        carrier_headers.ROUTING_HEADERS
    )
    first, last = mutations[0]["append"]["header"], mutations[-1]["append"]["header"]
    assert first == {"key": carrier_headers.CLIENT_REQUEST_ID, "value": "%REQ(x-request-id)%"}
    assert last == {"key": carrier_headers.REQUEST_ID, "value": "%UNIQUE_ID%"}


def _request_id_mutation(config):
    (found,) = [
        m
        for m in _step_mutations(config)
        if m.get("append", {}).get("header", {}).get("key") == carrier_headers.REQUEST_ID
    ]
    return found["append"]


def _re_added(config):
    _step_mutations(config).append(
        {"append": {"header": {"key": "x-prefiller-host-port", "value": "%REQ(x-mine)%"}}}
    )


def _second_filter(position):
    def change(config):
        restore = {
            "name": "restore",
            "typed_config": {
                "@type": carrier_headers.FILTER_TYPE,
                "mutations": {
                    "request_mutations": [
                        {
                            "append": {
                                "header": {
                                    "key": carrier_headers.REQUEST_ID,
                                    "value": "%REQ(x-client-request-id)%",
                                },
                                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                            }
                        }
                    ]
                },
            },
        }
        hcm(config)["http_filters"].insert(position(config), restore)

    return change


def _added_by_the_router(config):
    vhost = hcm(config)["route_config"]["virtual_hosts"][0]
    vhost["request_headers_to_add"] = [
        {
            "header": {"key": carrier_headers.REQUEST_ID, "value": "%REQ(x-client-request-id)%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]


@pytest.mark.parametrize(
    ("change", "text"),
    [
        # The default append action appends to the client's id: "<client's>,<fresh>".
        (lambda c: _request_id_mutation(c).pop("append_action"), "keeps a client's x-request-id"),
        (
            lambda c: _request_id_mutation(c).update(append_action="ADD_IF_ABSENT"),
            "keeps a client's x-request-id",
        ),
        (_re_added, "writes x-prefiller-host-port after removing it"),
        (_second_filter(ext_proc_index), "filter restore writes x-request-id from the request"),
        (_second_filter(lambda c: len(filter_names(c)) - 1), "filter restore writes x-request-id"),
        (_added_by_the_router, "request_headers_to_add writes x-request-id from the request"),
    ],
    ids=["default-action", "add-if-absent", "re-added", "filter-before", "filter-after", "router"],
)
def test_an_edit_that_hands_a_client_header_back_is_an_error(change, text):
    (error,) = mutated(change).errors
    assert text in error


def test_a_later_filter_may_write_its_own_routing_header():
    # An endpoint picker's own choice (a constant here) is not a client's.
    def change(config):
        picker = copy.deepcopy(_step(config))
        picker["name"] = "picker"
        picker["typed_config"]["mutations"]["request_mutations"] = [
            {"append": {"header": {"key": "x-prefiller-host-port", "value": "10.0.0.5:8000"}}}
        ]
        hcm(config)["http_filters"].insert(len(filter_names(config)) - 1, picker)

    assert (mutated(change).errors, mutated(change).warnings) == ([], [])


def test_header_names_with_underscores_passing_is_a_warning():
    report = mutated(lambda c: hcm(c).pop("common_http_protocol_options"))
    assert report.errors == []
    (warning,) = report.warnings
    assert "header names with underscores pass" in warning
