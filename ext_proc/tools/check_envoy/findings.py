"""What ``check-envoy`` finds: values with a stable code, a place and a severity.

A code names one kind of problem and never changes meaning; its message may be
reworded. ``CODES`` is their one list (docs/operations.md#check-envoy-findings shows
it): a finding with a code not listed cannot be made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

Severity = Literal["error", "warning"]

CODES: Final[Mapping[str, str]] = MappingProxyType(
    {
        # The configuration as a whole.
        "no-connection-manager": "no HTTP connection manager (of the listeners named)",
        "listener-missing": "a listener named with --listener is not in the configuration",
        "ext-proc-missing": "a connection manager runs no ext_proc filter of this processor",
        "routes-unseen": "routes come from RDS, scoped routes or VHDS, which the check cannot read",
        "listeners-unseen": "listeners come from LDS, which the check cannot read",
        "filter-chain-unchecked": (
            "a filter chain of a listener with policed routes ends in no inline connection manager"
        ),
        "network-filter-unknown": "a network filter before the connection manager is not known",
        "listener-filter-unknown": (
            "a listener filter of a listener with policed routes does not only choose a chain"
        ),
        "policed-cluster-bypassed": (
            "a listener without this processor's filter reaches (or may: a DNS name) a cluster "
            "a policed route reaches"
        ),
        "matcher-tree": "a virtual host chooses routes by a matcher tree",
        "path-not-normalized": "normalize_path is not true",
        "escaped-slashes-kept": "path_with_escaped_slashes_action keeps '%2F' in the path",
        "upgrade-filter-chain": "an upgrade runs a filter chain of its own",
        "envoy-rejects": "Envoy itself rejects the configuration (envoy --mode validate)",
        "envoy-file-missing": "Envoy stopped at a file this machine lacks; the rest unvalidated",
        "envoy-validate-not-run": "no envoy to run envoy --mode validate with, and not skipped",
        # This processor's ext_proc filter, and its per-route configurations.
        "failure-mode-allow": "the filter fails open (failure_mode_allow)",
        "observability-mode": "the filter runs in observability_mode",
        "content-length-allowed": "allow_content_length_header lets stale lengths through",
        "refusals-dropped": "disable_immediate_response drops the processor's refusals",
        "attributes-missing": "request_attributes lacks a route metadata attribute",
        "body-not-inspected": "a request_body_mode the processor cannot inspect",
        "one-message-incomplete": "headers skipped without a BUFFERED body and header attributes",
        "streamed-without-trailers": "FULL_DUPLEX_STREAMED without request_trailer_mode SEND",
        "override-fails-open": "an ExtProcPerRoute override sets failure_mode_allow",
        "per-route-name-unknown": "an ext_proc per-route configuration names no filter",
        "processor-cluster-missing": "the filter's grpc_service names no static cluster",
        "processor-cluster-unseen": "the filter's grpc_service cluster comes from CDS",
        "override-grpc-service": "an ExtProcPerRoute override names another service",
        "processor-plaintext": "the processor demands TLS and its cluster has no TLS socket",
        "processor-unverified": "the processor's TLS socket verifies no certificate of it",
        "processor-client-certificate-missing": (
            "the processor demands a client certificate and its cluster presents none"
        ),
        "processor-tls-unseen": "the processor demands TLS and its socket cannot be seen",
        "processor-name-unpinned": "the processor's TLS socket checks a CA and no name of it",
        "processor-error-status": "the filter's status_on_error is not 503",
        "processor-connection-unbounded": (
            "the processor's cluster sets no HTTP/2 max_concurrent_streams or max_outbound_frames"
        ),
        "retry-after-missing": (
            "a policed route's processor failures get no retry-after (no local reply mapper, "
            "no response_headers_to_add)"
        ),
        # Other filters of the chain.
        "filter-type-unknown": "an HTTP filter of a type not in the check's table of filters",
        "per-route-field-refused": "a per-route filter configuration sets what its type may not",
        "other-ext-proc-first": "another ext_proc filter runs before this processor's",
        "other-ext-proc-before-hold": "another ext_proc filter runs before the buffer filter",
        "other-ext-proc-fails-open": "another service's ext_proc filter fails open",
        "header-step-missing": "no working header step before this processor's filter",
        "header-rewritten-by-filter": (
            "a filter after the header step can write a carrier or the request id from the request"
        ),
        "header-rewritten-by-route": "request_headers_to_add writes a guarded header",
        "header-step-per-route": "a route or virtual host configures the header step",
        "underscore-headers": "header names with underscores pass",
        "filter-after-decision": "a filter after this processor's can change the request",
        "declared-filter-unbounded": "a declared ext_proc filter may change path or routing",
        "declared-filter-absent": "a filter declared with --declared-filter is not in the chain",
        # A forwarding route.
        "ext-proc-not-running": "no ext_proc filter of this processor runs on the route",
        "ext-proc-off-for-cluster": "a weighted cluster turns every ext_proc filter off",
        "route-unpoliced": (
            "a route of a scoped wiring runs none of this processor's filters, its clusters "
            "apart from the policed routes' by name (an Istio Service's by its host)"
        ),
        "hold-missing": "headers skipped and no buffer filter after the filter holds them",
        "hold-limit-unstated": "a buffer filter sets a limit on a route that states none",
        "hold-limit-raised": "a buffer filter's limit is above the route's",
        "hold-limit-lowered": "a buffer filter's limit is below the route's",
        "policy-missing": "no policy metadata (aggregated + strip)",
        "policy-namespace-misspelt": "metadata under a name one slip from the policy namespace",
        "policy-not-mapping": "the policy metadata is not a mapping",
        "policy-invalid": "the policy metadata is invalid, as the processor would refuse it",
        "mint-response-unseen": "a mint route whose response the processor does not see",
        "trust-any-caller": "an honor route trusts any caller",
        "vocab-size-missing": "an honor route without vocab_size",
        "rewrite-stated-not-made": "metadata states a rewrite the route does not make",
        "rewrite-unfollowed": "a prefix_rewrite of a matcher that is not a prefix",
        "rewrite-unstated": "a prefix_rewrite the metadata does not state",
        "rewrite-misstated": "metadata states a rewrite other than the route's",
        "tenant-header-unguarded": (
            "a client's copy of a route's tenant header can reach this processor's filter"
        ),
        "decided-cluster-unseen": "a mint or honor route's cluster is no static one, unchecked",
        "decided-cluster-chosen": (
            "a mint or honor route's cluster, or its ORIGINAL_DST host, is chosen per request"
        ),
        "field-spelt-twice": "a field spelt by its proto name and its JSON name in one message",
        # The closed world (``coverage``): on a listener that carries a policed route.
        "field-refused": "a field the check refuses where a policed route is",
        "field-unclassified": "a field of Envoy's schema the check's classification lacks",
        "field-unknown": "a key that is no field of its message in Envoy's schema",
        "tenant-headers-skipped": (
            "a route that names a tenant source skips the request headers (one message)"
        ),
        "tenant-route-audited": "a route that names a tenant source is in audit mode",
        "tenant-pair-mismatch": (
            "a mint route and an honor route one client reaches name different tenant sources"
        ),
        "body-retried": "a retry policy can resend a mint or honor route's body",
        "body-hedged": "a hedge policy sends a mint or honor route's body twice",
        "body-mirrored": "a mirror policy copies a mint or honor route's body",
        "retry-header-added": "request_headers_to_add sets a header the router retries by",
        "retry-header-trusted": "internal_address_config lets clients' retry headers through",
        "router-header-writer": "a filter after the header step can write a retry or hedge header",
        # Route selection and vLLM's token-in and echo endpoints.
        "route-unreadable": "a route whose paths the simulation cannot tell",
        "rewrite-unreadable": "a rewrite whose upstream paths the simulation cannot tell",
        "pattern-before-404s": "a pattern route forwards before the 404s of every token path",
        "token-path-forwarded": "a route forwards a path that reaches a token endpoint",
        "refused-endpoint-forwarded": "a route forwards a path to an endpoint its policy refuses",
    }
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: ``code`` (one of ``CODES``), where it is (``place``, the connection
    manager and the route or filter; empty for the configuration as a whole), how bad
    (``severity``: an error fails the check) and what it means (``message``)."""

    code: str
    place: str
    severity: Severity
    message: str

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"finding code {self.code!r} is not in CODES")

    @property
    def text(self) -> str:
        """The place and the message, as one line."""
        return f"{self.place}: {self.message}" if self.place else self.message


def error(code: str, place: str, message: str) -> Finding:
    return Finding(code, place, "error", message)


def warning(code: str, place: str, message: str) -> Finding:
    return Finding(code, place, "warning", message)


@dataclass(frozen=True, slots=True)
class Report:
    """Every finding, in the order the check made them, and the routes it read."""

    findings: tuple[Finding, ...]
    routes: int

    @property
    def errors(self) -> list[str]:
        return [f.text for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[str]:
        return [f.text for f in self.findings if f.severity == "warning"]

    def codes(self, severity: Severity | None = None) -> list[str]:
        return [f.code for f in self.findings if severity in (None, f.severity)]
