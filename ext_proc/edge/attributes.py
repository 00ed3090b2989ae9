"""The Envoy attribute contract: every CEL expression the ext_proc filter must request.

Envoy hands route metadata to the processor only through CEL ``request_attributes``,
one expression per field (a whole map arrives as the text "CelMap value"), and CEL
renders numbers as decimal strings; ``size(...)`` of the namespace lets the processor
notice fields it does not know. The peer's certificate attributes identify an mTLS
caller. With ``request_header_mode: SKIP`` (one message per
request) the headers the processor checks come as attributes too. The codec reads
these keys, ``check-envoy`` demands them and ``envoy-config`` writes them: this module
is their one source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ext_proc.core.read_headers import CHECKED_HEADERS
from ext_proc.core.read_headers import TRACE_HEADERS as TRACE_HEADER_NAMES
from ext_proc.core.route_policy import DEFAULT_NAMESPACE, FIELDS, Scalar

# The matched route's name, for metrics and logs (not part of the policy).
ROUTE_NAME: Final = "xds.route_name"


def header(name: str) -> str:
    """The CEL expression of a request header's value (its values joined by commas)."""
    return f"request.headers['{name}']"


# The form of ``header``'s expressions, with the header's name as its group.
HEADER_ATTRIBUTE: Final = re.compile(r"request\.headers\['([a-z0-9][a-z0-9_-]*)'\]")
# Headers the processor checks, requested as attributes when the headers message is
# skipped. A route's tenant header is read from its headers message, which a route that
# names a tenant source is always sent; the codec still reads every header attribute.
HEADERS: Final = {name: header(name) for name in CHECKED_HEADERS}
# Headers only the span of a decision reads (``ext_proc.edge.tracing``), requested beside
# HEADERS when the headers message is skipped: the W3C trace context Envoy's tracer sets
# (a client's, where Envoy traces nothing), and the request id the request came with,
# which the header step moved aside. Nothing is decided on them, so a config without
# them loses only the join of the traces.
TRACE_HEADERS: Final = {name: header(name) for name in TRACE_HEADER_NAMES}
# Every header read from attributes, in the order the codec lists them; the ones whose
# value is new with every request (the ids, the trace context) come last.
READ_HEADERS: Final = {**HEADERS, **TRACE_HEADERS}
PER_REQUEST: Final = ("x-request-id", *TRACE_HEADERS)


# The request's path without its query (after Envoy's normalisation, before the route's
# rewrite): with the route's rewrite it names the API the upstream serves.
PATH: Final = "request.url_path"

# The downstream peer's certificate (docs/trust.md): a route's ``peers`` are matched
# against its identities when the connection is mutual TLS and Envoy validated the
# certificate. Every SAN is read from the certificate itself (``peer``): Envoy's SAN
# attributes name only the first of each type.
PEER: Final = {
    "mtls": "connection.mtls",
    "validated": "connection.peer_certificate_valid",
    "certificate": "connection.peer_certificate",
    "subject": "connection.subject_peer_certificate",
}


@dataclass(frozen=True, slots=True)
class AttributeKeys:
    """The CEL expressions (attribute keys) that carry one namespace's fields."""

    fields: Mapping[str, str]
    size: str
    # Every key the processor reads: ``all()`` and the headers' (for lookups).
    wanted: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "wanted", frozenset((*self.all(), *READ_HEADERS.values())))

    @classmethod
    def for_namespace(cls, namespace: str = DEFAULT_NAMESPACE) -> AttributeKeys:
        base = f"xds.route_metadata.filter_metadata['{namespace}']"
        return cls(
            fields={name: f"{base}.{name}" for name in FIELDS},
            size=f"size({base})",
        )

    def all(self) -> tuple[str, ...]:
        """Every expression the Envoy filter must list in ``request_attributes``."""
        return (*self.fields.values(), self.size, ROUTE_NAME, PATH, *PEER.values())


def attribute_keys(namespace: str = DEFAULT_NAMESPACE) -> AttributeKeys:
    return AttributeKeys.for_namespace(namespace)


def as_cel(value: Any) -> Scalar:
    """What a CEL attribute carries for a route metadata value written in YAML: numbers
    as their decimal text, a map or list as the text of its type."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return str(int(value)) if float(value).is_integer() else str(value)
    if isinstance(value, str):
        return value
    return "CelMap value" if isinstance(value, dict) else "CelList value"
