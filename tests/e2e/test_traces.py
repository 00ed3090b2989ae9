"""Traces: Envoy's OpenTelemetry tracer and the processor's spans, both exported over
OTLP/gRPC to one real receiver (tests/collector.py); the processor's span of each
decision is a child of Envoy's span of its ext_proc call, itself a child of Envoy's span
of the request, all in one trace, in each body arrangement."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ext_proc.core.address import HostPort
from tests.collector import Collector, Span
from tests.e2e.conftest import BODY_MODES
from tests.e2e.stack import Stack

ENVOY_SERVICE = "gateway-envoy"
PROCESSOR_SERVICE = "gateway-processor"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
FORGED = {**CHAT, "kv_transfer_params": {"prompt_token_ids": [1, 2, 3]}}
SERVER = 2  # Span.SpanKind.SPAN_KIND_SERVER
UNSET = 0  # Status.StatusCode.STATUS_CODE_UNSET


def _traced(collector: HostPort, *, sample_by_request_id: bool = False) -> Any:
    """An edit of the rendered config: Envoy's OpenTelemetry tracer on the gateway's
    connection manager, exporting each span at once to ``collector``; the trace decision
    taken from the request id only with ``sample_by_request_id`` (Envoy's default)."""

    def edit(config: dict[str, Any]) -> None:
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        hcm["typed_config"]["tracing"] = {
            "provider": {
                "name": "envoy.tracers.opentelemetry",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                    "grpc_service": {
                        "envoy_grpc": {"cluster_name": "otlp"},
                        "timeout": "1s",
                    },
                    "service_name": ENVOY_SERVICE,
                },
            },
            "random_sampling": {"value": 100},
        }
        # Envoy's default decides sampling from the x-request-id the request came with:
        # a client's id that is no UUID would keep its request out of every trace.
        hcm["typed_config"]["request_id_extension"] = {
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.request_id.uuid.v3."
                "UuidRequestIdConfig",
                "use_request_id_for_trace_sampling": sample_by_request_id,
            }
        }
        config["static_resources"]["clusters"].append(
            {
                "name": "otlp",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                        "HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}},
                    }
                },
                "load_assignment": {
                    "cluster_name": "otlp",
                    "endpoints": [
                        {
                            "lb_endpoints": [
                                {
                                    "endpoint": {
                                        "address": {
                                            "socket_address": {
                                                "address": collector.host,
                                                "port_value": collector.port,
                                            }
                                        }
                                    }
                                }
                            ]
                        }
                    ],
                },
            }
        )
        # Envoy's tracer exports every span as it ends, not in batches of five.
        (base,) = (x for x in config["layered_runtime"]["layers"] if x["name"] == "base")
        base["static_layer"]["tracing.opentelemetry.min_flush_spans"] = 1

    return edit


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    with Collector() as running:
        yield running


@pytest.fixture(scope="module", params=list(BODY_MODES))
def traced(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: Collector,
) -> Iterator[Stack]:
    tracing = {
        "enabled": True,
        "endpoint": str(collector.address),
        "service_name": PROCESSOR_SERVICE,
    }
    with Stack(
        tmp_path_factory.mktemp(f"traced-{request.param}"),
        source=BODY_MODES[request.param],
        edit=_traced(collector.address),
        processor_config={"tracing": tracing},
    ) as running:
        yield running


def _decision(spans: list[Span], request_id: str, service: str = PROCESSOR_SERVICE) -> Span | None:
    for span in spans:
        ids = span.attributes.get("http.request.header.x-request-id")
        if span.service == service and ids == [request_id]:
            return span
    return None


def _same_id(logged: str | None, sent: str) -> bool:
    """Whether Envoy logged ``sent`` as the id the request came with: Envoy's tracer
    writes its trace decision into the version digit of a UUID request id."""
    if logged is None or len(logged) != len(sent):
        return False
    return logged == sent or (logged[:14] + logged[15:] == sent[:14] + sent[15:])


def _send(stack: Stack, path: str, body: dict[str, Any], client_id: str) -> tuple[int, str]:
    """The answer's status and the request id the gateway gave the request, as Envoy's
    access log names it beside the client's (``client_id``, no UUID)."""
    stack.clear()
    reply = httpx.post(
        f"{stack.url}{path}",
        content=json.dumps(body),
        headers={"content-type": "application/json", "x-request-id": client_id},
        timeout=10,
    )
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(x) for x in stack.logs("envoy").splitlines() if x.startswith("{")]
        entries = [x for x in lines if _same_id(x.get("client_request_id"), client_id)]
        if entries or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (entry,) = entries
    if reply.status_code == 200:  # the id the stand-in received is the gateway's
        (received,) = stack.received()
        assert received.header("x-request-id") == [entry["request_id"]]
    return reply.status_code, entry["request_id"]


@pytest.mark.parametrize(
    ("path", "body", "status", "decision", "reason"),
    [
        ("/v1/chat/completions", CHAT, 200, "allow", "no_transfer_params"),
        ("/v1/chat/completions", FORGED, 200, "strip", "stripped_by_policy"),
        ("/deny/v1/chat/completions", FORGED, 400, "deny", "denied_by_policy"),
    ],
    ids=["allow", "strip", "deny"],
)
def test_the_decision_span_is_a_child_of_envoys_span(
    traced: Stack,
    collector: Collector,
    path: str,
    body: dict[str, Any],
    status: int,
    decision: str,
    reason: str,
) -> None:
    client_id = f"client-chosen-{decision}"
    answered, request_id = _send(traced, path, body, client_id)
    assert answered == status
    spans = collector.wait_for(lambda found: _decision(found, request_id) is not None)
    span = _decision(spans, request_id)
    assert span is not None
    # Envoy ends its spans after the response: wait for the call's and the request's.
    spans = collector.wait_for(
        lambda found: (
            any(s.span_id == span.parent_span_id for s in found)
            and any(s.name == "ingress" and s.trace_id == span.trace_id for s in found)
        )
    )
    (call,) = [s for s in spans if s.span_id == span.parent_span_id]
    (ingress,) = [s for s in spans if s.span_id == call.parent_span_id]
    assert call.service == ingress.service == ENVOY_SERVICE
    assert call.name == "async envoy.service.ext_proc.v3.ExternalProcessor.Process egress"
    assert ingress.name == "ingress"
    assert ingress.attributes["guid:x-request-id"] == request_id
    assert span.trace_id == call.trace_id == ingress.trace_id
    assert span.name == "ext_proc.decide"
    assert span.kind == SERVER
    # A refusal is the policy's outcome, not the processor's failure.
    assert span.status_code == UNSET
    attributes = span.attributes
    assert attributes["ext_proc.decision"] == decision
    assert attributes["ext_proc.reason"] == reason
    assert attributes["ext_proc.route"]
    assert attributes["ext_proc.topology"] == "aggregated"
    assert attributes["url.path"] == path
    # The client's id is on the span beside the gateway's; only the gateway's went on.
    assert attributes["http.request.header.x-client-request-id"] == [client_id]
    assert request_id != client_id


def test_by_default_a_clients_request_id_decides_whether_envoy_traces(
    tmp_path_factory: pytest.TempPathFactory, collector: Collector
) -> None:
    """Envoy's default (``use_request_id_for_trace_sampling: true``) takes the trace
    decision from the x-request-id the request came with: a client's id that is no UUID
    keeps the request out of Envoy's trace and so out of the processor's, which follows
    Envoy's sampled flag. A UUID is traced (and shows the export works)."""
    tracing = {"enabled": True, "endpoint": str(collector.address)}
    with Stack(
        tmp_path_factory.mktemp("traced-by-id"),
        source=BODY_MODES["one-message"],
        edit=_traced(collector.address, sample_by_request_id=True),
        processor_config={"tracing": tracing},
    ) as stack:
        _, untraced = _send(stack, "/v1/chat/completions", CHAT, "client-no-uuid")
        _, traced = _send(stack, "/v1/chat/completions", CHAT, str(uuid.uuid4()))
        spans = collector.wait_for(
            lambda found: (
                any(
                    s.name == "ingress" and s.attributes.get("guid:x-request-id") == traced
                    for s in found
                )
                and _decision(found, traced, "ext-proc-token-policy") is not None
            )
        )
    assert _decision(spans, untraced, "ext-proc-token-policy") is None
    assert not [s for s in spans if s.attributes.get("guid:x-request-id") == untraced]
