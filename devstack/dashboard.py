"""``python -m devstack dashboard``: the Grafana dashboard of the processor,
``deploy/monitoring/dashboard.json``, generated with grafana-foundation-sdk from ``PANELS``.

Every panel reads Prometheus through the ``datasource`` variable. The processor's own
series are selected with ``job=~"$job"`` (and ``route=~"$route"`` where they have a
route); the recording rules of deploy/monitoring/rules.yaml carry ``job`` too. Envoy's
series (its admin endpoint's ``/stats/prometheus``) are selected with
``job=~"$envoy_job"``. Rates of the processor's raw counters use 5-minute windows, as the
recording rules and alerts do; Envoy's use ``$__rate_interval``.
tests/test_generated.py fails when the committed JSON differs from ``render()``;
tests/e2e/test_dashboard.py checks every expression with promtool and every series name
against the rules, the processor's metrics and the Envoy stats it was verified with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableModel,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "monitoring" / "dashboard.json"
UID: Final = "ext-proc-token-policy"
TITLE: Final = "ext_proc token-id policy"
JOB: Final = "ext-proc-token-policy"
ENVOY_JOB: Final = "envoy"

_DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
_WIDTH = 24
_HEIGHT = 8

# Matchers, as they appear inside a selector's braces.
_JOB = 'job=~"$job"'
_ROUTE = 'route=~"$route"'
_ENVOY_JOB = 'job=~"$envoy_job"'
# Envoy's admin listener has its own connection manager; it is not the gateway.
_NOT_ADMIN = 'envoy_http_conn_manager_prefix!="admin"'

HONOR_REASONS: Final = (
    "trusted_proof",
    "proof_missing",
    "proof_malformed",
    "proof_superseded",
    "proof_unknown_key",
    "proof_bad_signature",
    "proof_expired",
    "proof_outlives_lease",
    "proof_partition_mismatch",
    "prompt_mismatch",
    "proof_replayed",
    "proof_record_unavailable",
    "proof_predates_record",
    "proof_record_full",
    "clock_behind",
)
NOT_MINTED_REASONS: Final = (
    "no_signing_key",
    "not_renderable",
    "response_not_json",
    "response_ids_malformed",
    "response_connector_out_of_bounds",
    "response_not_affordable",
    "response_too_deep",
    "nothing_to_mint",
    "endpoint_not_mintable",
)
ENVOY_EXT_PROC_STATS: Final = (
    "streams_started",
    "streams_failed",
    "message_timeouts",
    "immediate_responses_sent",
    "failure_mode_allowed",
)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    row: str
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    # A red threshold line (the alert's threshold), when the panel has one.
    threshold: float | None = None


def _selector(name: str, *matchers: str) -> str:
    return f"{name}{{{', '.join(matchers)}}}"


def _decisions(by: str, *matchers: str) -> str:
    """Decisions per second (the recording rule), summed by ``by``."""
    selector = _selector("ext_proc:decisions:rate5m", _JOB, _ROUTE, *matchers)
    return f"sum by ({by}) ({selector})"


def _one_of(values: tuple[str, ...]) -> str:
    return "|".join(values)


def _envoy_rate(name: str, by: str, *matchers: str) -> str:
    selector = _selector(name, _ENVOY_JOB, *matchers)
    return f"sum by ({by}) (rate({selector}[$__rate_interval]))"


def _envoy_p99(name: str, by: str, *matchers: str) -> str:
    return f"histogram_quantile(0.99, {_envoy_rate(name, f'{by}, le', *matchers)})"


PANELS: Final[tuple[PanelSpec, ...]] = (
    PanelSpec(
        row="Decisions",
        title="Requests by route",
        description="Requests per second per route that reached a decision "
        "(ext_proc:requests:rate5m; a mint route's responses are not counted again).",
        unit="reqps",
        queries=(Query(_selector("ext_proc:requests:rate5m", _JOB, _ROUTE), "{{route}}"),),
    ),
    PanelSpec(
        row="Decisions",
        title="Decisions by route and action",
        description="Policy decisions per second (ext_proc:decisions:rate5m), by route and "
        "action (allow, strip, honor, deny, mint). A mint route counts its request and its "
        "response.",
        unit="reqps",
        queries=(Query(_decisions("route, action"), "{{route}} {{action}}"),),
    ),
    PanelSpec(
        row="Decisions",
        title="Decisions by reason",
        description="Policy decisions per second by reason (reasons: docs/trust.md), and "
        "those taken in audit mode (logged, not enforced).",
        unit="reqps",
        queries=(
            Query(_decisions("reason"), "{{reason}}"),
            Query(_decisions("route", 'mode="audit"'), "{{route}} audit mode"),
        ),
    ),
    PanelSpec(
        row="Proofs",
        title="Proof outcomes on honor routes",
        description="Decode requests by what their proof was: trusted_proof is honored; the "
        "others are recomputed (or denied with unproven: deny). proof_bad_signature and "
        "proof_unknown_key fire ExtProcProofForgery.",
        unit="reqps",
        queries=(
            Query(
                _decisions("route, reason", f'reason=~"{_one_of(HONOR_REASONS)}"'),
                "{{route}} {{reason}}",
            ),
        ),
    ),
    PanelSpec(
        row="Proofs",
        title="Minted and not minted on mint routes",
        description="Prefill responses signed (minted) and left unsigned, by reason. "
        "Unsigned responses with none minted fire ExtProcNotMinting.",
        unit="reqps",
        queries=(
            Query(_decisions("route", 'reason="minted"'), "{{route}} minted"),
            Query(
                _decisions("route, reason", f'reason=~"{_one_of(NOT_MINTED_REASONS)}"'),
                "{{route}} not minted: {{reason}}",
            ),
        ),
    ),
    PanelSpec(
        row="Latency",
        title="Added latency per request",
        description="The processor's time per request (parse, policy, rewrite, encode) at "
        "the 50th and 99th percentiles over 5 minutes. Over 50 ms at p99 fires "
        "ExtProcSlowDecisions.",
        unit="s",
        queries=(
            Query(_selector("ext_proc:processing_seconds:p50_5m", _JOB, _ROUTE), "{{route}} p50"),
            Query(_selector("ext_proc:processing_seconds:p99_5m", _JOB, _ROUTE), "{{route}} p99"),
        ),
        threshold=0.05,
    ),
    PanelSpec(
        row="Latency",
        title="Request body size p99",
        description="The 99th percentile of inspected request-body sizes per route: larger "
        "bodies take longer to parse and hold more of the in-flight budget.",
        unit="bytes",
        queries=(
            Query(
                "histogram_quantile(0.99, sum by (route, le) (rate("
                + _selector("ext_proc_request_body_bytes_bucket", _JOB, _ROUTE)
                + "[5m])))",
                "{{route}} p99",
            ),
        ),
    ),
    PanelSpec(
        row="In-flight budget",
        title="In-flight budget in use",
        description="The share of the in-flight body budget held now "
        "(ext_proc:inflight_budget:ratio). Over 90% for 5 minutes fires "
        "ExtProcBudgetSaturated; past 100%, requests get 503.",
        unit="percentunit",
        queries=(Query(_selector("ext_proc:inflight_budget:ratio", _JOB), "{{job}}"),),
        threshold=0.9,
    ),
    PanelSpec(
        row="In-flight budget",
        title="In-flight bytes and budget per replica",
        description="Request-body bytes held now and the budget, per replica (sampled once a "
        "second).",
        unit="bytes",
        queries=(
            Query(
                f"sum by (instance) ({_selector('ext_proc_inflight_body_bytes', _JOB)})",
                "{{instance}} held",
            ),
            Query(
                f"sum by (instance) ({_selector('ext_proc_inflight_budget_limit_bytes', _JOB)})",
                "{{instance}} budget",
            ),
        ),
    ),
    PanelSpec(
        row="In-flight budget",
        title="Open streams per replica",
        description="ext_proc streams open now, per replica (sampled once a second).",
        unit="short",
        queries=(
            Query(
                f"sum by (instance) ({_selector('ext_proc_inflight_streams', _JOB)})",
                "{{instance}}",
            ),
        ),
    ),
    PanelSpec(
        row="In-flight budget",
        title="503 refusals: budget exhausted",
        description="Requests refused with 503 and retry-after because the in-flight budget "
        "was full (reason inflight_budget_exhausted); fires ExtProcBudgetRefusals.",
        unit="reqps",
        queries=(Query(_decisions("route", 'reason="inflight_budget_exhausted"'), "{{route}}"),),
    ),
    PanelSpec(
        row="Stream errors",
        title="Stream error ratio",
        description="Streams ended with an error (protocol violations, internal errors; not "
        "cancellations) over all streams: Envoy answers those 5xx. Over 1% for 5 minutes "
        "fires ExtProcStreamErrors.",
        unit="percentunit",
        queries=(Query(_selector("ext_proc:stream_errors:ratio_rate5m", _JOB), "{{job}}"),),
        threshold=0.01,
    ),
    PanelSpec(
        row="Stream errors",
        title="Stream errors by kind",
        description="Streams ended with an error per second: protocol_violation, internal, "
        "cancelled (the client went away), shutdown (still open when the processor stopped).",
        unit="reqps",
        queries=(
            Query(
                f"sum by (kind) (rate({_selector('ext_proc_stream_errors_total', _JOB)}[5m]))",
                "{{kind}}",
            ),
        ),
    ),
    PanelSpec(
        row="Envoy",
        title="Gateway responses by class (Envoy)",
        description="Responses Envoy sent to clients, by HTTP connection manager and status "
        "class (envoy_http_downstream_rq_xx; the admin listener left out).",
        unit="reqps",
        queries=(
            Query(
                _envoy_rate(
                    "envoy_http_downstream_rq_xx",
                    "envoy_http_conn_manager_prefix, envoy_response_code_class",
                    _NOT_ADMIN,
                ),
                "{{envoy_http_conn_manager_prefix}} {{envoy_response_code_class}}xx",
            ),
        ),
    ),
    PanelSpec(
        row="Envoy",
        title="Upstream responses by cluster (Envoy)",
        description="Responses from each upstream cluster by status class "
        "(envoy_cluster_upstream_rq_xx); the ext_proc cluster is the processor's gRPC.",
        unit="reqps",
        queries=(
            Query(
                _envoy_rate(
                    "envoy_cluster_upstream_rq_xx",
                    "envoy_cluster_name, envoy_response_code_class",
                ),
                "{{envoy_cluster_name}} {{envoy_response_code_class}}xx",
            ),
        ),
    ),
    PanelSpec(
        row="Envoy",
        title="Request time p99 (Envoy)",
        description="The 99th percentile of the whole request as the client sees it "
        "(envoy_http_downstream_rq_time) and of each upstream cluster's time "
        "(envoy_cluster_upstream_rq_time); Envoy records both in milliseconds.",
        unit="ms",
        queries=(
            Query(
                _envoy_p99(
                    "envoy_http_downstream_rq_time_bucket",
                    "envoy_http_conn_manager_prefix",
                    _NOT_ADMIN,
                ),
                "{{envoy_http_conn_manager_prefix}} downstream p99",
            ),
            Query(
                _envoy_p99("envoy_cluster_upstream_rq_time_bucket", "envoy_cluster_name"),
                "{{envoy_cluster_name}} upstream p99",
            ),
        ),
    ),
    PanelSpec(
        row="Envoy",
        title="ext_proc filter (Envoy)",
        description="The ext_proc filter's own counters: streams started and failed, "
        "message timeouts, immediate responses (the processor's denials and 503s) and "
        "requests let through by failure_mode_allow (0 in a fail-closed config).",
        unit="reqps",
        queries=tuple(
            Query(
                _envoy_rate(f"envoy_http_ext_proc_{stat}", "envoy_http_conn_manager_prefix"),
                f"{{{{envoy_http_conn_manager_prefix}}}} {stat}",
            )
            for stat in ENVOY_EXT_PROC_STATS
        ),
    ),
)


def _variables() -> list[Builder[VariableModel]]:
    def text(name: str, label: str, default: str, description: str) -> Builder[VariableModel]:
        return (
            dashboard_builder.TextBoxVariable(name)
            .id(name)
            .label(label)
            .description(description)
            .default_value(default)
            .current(VariableOption(selected=True, text=default, value=default))
        )

    return [
        (
            dashboard_builder.DatasourceVariable("datasource")
            .id("datasource")
            .label("Data source")
            .type("prometheus")
        ),
        text("job", "Processor job", JOB, "The processor's scrape job (a regular expression)."),
        text("envoy_job", "Envoy job", ENVOY_JOB, "Envoy's scrape job (a regular expression)."),
        dashboard_builder.QueryVariable("route")
        .id("route")
        .label("Route")
        .description("Envoy route names (xds.route_name) the processor has decided on.")
        .datasource(_DATASOURCE)
        .query(f"label_values({_selector('ext_proc_decisions_total', _JOB)}, route)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text=["All"], value=["$__all"])),
    ]


def _panel(spec: PanelSpec, panel_id: int, width: int) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(_DATASOURCE)
        .unit(spec.unit)
        .min(0)
        .span(width)
        .height(_HEIGHT)
        .fill_opacity(10)
        .legend(
            common_builder.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(
            common_builder.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if spec.threshold is not None:
        panel = panel.thresholds(
            dashboard_builder.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(None, "green"), Threshold(spec.threshold, "red")])
        ).thresholds_style(
            common_builder.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.LINE)
        )
    for index, query in enumerate(spec.queries):
        ref = chr(ord("A") + index)
        panel = panel.with_target(
            prometheus.Dataquery().ref_id(ref).expr(query.expr).legend_format(query.legend).range()
        )
    return panel


def build() -> dashboard_builder.Dashboard:
    board = (
        dashboard_builder.Dashboard(TITLE)
        .uid(UID)
        .description(
            "The token-id policy processor (ext_proc) and Envoy in front of it: decisions, "
            "proofs, added latency, the in-flight budget, stream errors. Generated by "
            "`make dashboard` (devstack/dashboard.py); runbooks: docs/operations.md#alerts."
        )
        .tags(["ext-proc", "envoy", "vllm"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .timezone("browser")
        .refresh("30s")
        .variables(_variables())
    )
    rows = list(dict.fromkeys(spec.row for spec in PANELS))
    panel_id = 0
    for row in rows:
        panel_id += 1
        board = board.with_row(dashboard_builder.Row(row).id(panel_id))
        specs = [spec for spec in PANELS if spec.row == row]
        for index, spec in enumerate(specs):
            panel_id += 1
            alone = index == len(specs) - 1 and len(specs) % 2 == 1
            board = board.with_panel(_panel(spec, panel_id, _WIDTH if alone else _WIDTH // 2))
    return board


def render() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"
