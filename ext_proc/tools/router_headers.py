"""The request headers Envoy's router reads to send one request's body upstream more than
once: this list is their one source. The header step (``carrier_headers``) removes them,
so nothing a filter before it wrote reaches the router; ``check-envoy`` refuses anything
after the step that could write one back (a filter, a route's header additions), on a
connection manager with a ``mint`` or ``honor`` route, whose body is decided once.

From Envoy 1.40's router filter ("HTTP headers (consumed from downstreams)",
docs/root/configuration/http/http_filters/router_filter.rst, and
source/common/router/router.cc ``Filter::decodeHeaders``; each seen retrying or hedging
the stand-in's request on the 1.40 binary, tests/e2e/test_decided_once.py):

- ``x-envoy-retry-on``, ``x-envoy-retry-grpc-on``: a retry policy of the request's own,
  even on a route with none;
- ``x-envoy-max-retries``, ``x-envoy-retriable-status-codes``,
  ``x-envoy-retriable-header-names``: how many retries, and on which answers;
- ``x-envoy-upstream-rq-per-try-timeout-ms``: a per-try timeout, after which a retry or a
  hedge goes out;
- ``x-envoy-hedge-on-per-try-timeout``: the hedge, a second copy beside the first.

Not listed, since none makes a second copy: ``x-envoy-upstream-rq-timeout-ms`` and
``x-envoy-upstream-stream-duration-ms`` (deadlines: the request ends),
``x-envoy-upstream-rq-timeout-alt-response`` (a 204 in place of that deadline's 504),
``x-envoy-expected-rq-timeout-ms`` (a deadline, read with ``respect_expected_rq_timeout``),
``x-envoy-upstream-alt-stat-name`` (statistics), ``x-envoy-decorator-operation``
(tracing). No request header mirrors or redirects a request by itself: a mirror needs a
route's ``request_mirror_policies`` (whose ``cluster_header`` only names the cluster),
an internal redirect the route's ``internal_redirect_policy`` (and runs the filter chain,
this processor's filter included, again); check-envoy judges both policies.

The router reads the hedge and per-try timeout headers before it applies the route's
header mutations (``finalHedgingParams`` and ``finalTimeout`` come before
``finalizeRequestHeaders``), the retry headers after: a route's
``request_headers_to_remove`` cannot keep the first two from it, the header step can.
"""

from __future__ import annotations

from typing import Final

ROUTER_HEADERS: Final = (
    "x-envoy-retry-on",
    "x-envoy-retry-grpc-on",
    "x-envoy-max-retries",
    "x-envoy-retriable-status-codes",
    "x-envoy-retriable-header-names",
    "x-envoy-upstream-rq-per-try-timeout-ms",
    "x-envoy-hedge-on-per-try-timeout",
)
