"""``check-envoy FILE [--listener NAME] [--declared-filter NAME] [--processor-config FILE]
[--no-envoy-validate]``: check an Envoy configuration offline, before it protects anything.

The real Envoy validates the file first (``envoy_validate``: ``envoy --mode validate``;
without an Envoy the check fails unless told to skip it, and its verdict says which),
and this processor's filter reaches it through a cluster the bootstrap lists.

This processor's ext_proc filters are those that request its route metadata attributes;
another service's ext_proc filter (an endpoint picker's) may run after them and after
the buffer filter that holds the request for them, not before. Every HTTP connection
manager (of the named listeners, when some are named) must run one. For each: the filter
fails closed, uses an inspectable body mode and requests every route-metadata attribute;
every route's policy metadata is valid (the same validation the processor applies at
request time); no per-route override (route, virtual host, route configuration or
weighted cluster) makes the filter fail open; a ``mint`` route sends the processor its
response headers and buffered response body (docs/trust.md), or nothing is signed; every
forwarding route runs an ext_proc filter (one disabled there, or disabled by default and
not enabled there, forwards bodies nobody inspected, ids included); a ``mint`` or
``honor`` route with a ``prefix_rewrite`` tells the processor about it in its metadata
(``match_prefix`` and ``prefix_rewrite`` equal to the route's match prefix and rewrite,
or the processor binds proofs to the wrong endpoint), and rewrites no other way; no
route forwards a path that reaches one of vLLM's token-in or echo endpoints upstream
(``token_endpoints``): Envoy's first-match route selection is simulated, per virtual
host, for probe paths made from every route's prefix and rewrite (``route_probes``,
regexes run by RE2 as Envoy runs them), after the connection manager has normalised the
path as the upstream will decode it (``normalize_path``, and escaped slashes unescaped
or refused); what the simulation cannot evaluate exactly is an error, never a pass; a
route where a filter skips the request headers (one message) runs a buffer filter after
it, which holds the request until the decision. The filter keeps the processor's
refusals (no ``disable_immediate_response``), every ext_proc per-route configuration
names a filter of the chain, and no upgrade runs a filter chain of its own.
A ``mint`` or ``honor`` route's decided body reaches the upstreams once: no retry that
can follow a request an upstream read, no hedge, no mirror, at any level Envoy reads them
(``rules.replay``). Nothing after this processor's filter (HTTP filters, the router's and
clusters' upstream filters) can change the request it decided, unless known not to or
declared by the deployment (``declared``: llm-d's endpoint picker), and a declared
ext_proc filter may not change the path or routing headers (``rules.after_decision``).
Warnings: forwarding routes without policy metadata, ``strip`` or ``deny`` routes with a
rewrite their metadata does not state, and ``honor`` routes that trust any caller or
have no ``vocab_size``. Routes that forward nothing (a direct response or a redirect)
need neither metadata nor the filter.

Every rule reads the configuration in one spelling (``spelling``): a field by its JSON
name, an enum by its number and a ``TypedStruct`` are read as Envoy reads them, as the
proto name, the enum's name and the message it packs; a field given both ways in one
message is an error.

What it does not read, it refuses (a closed world): every field of the Envoy messages it
walks is classified once (``coverage``, ``field_classes``: read, refused or harmless,
over a table generated from Envoy's schema), and on a listener that carries a policed
route a refused, unclassified or unknown field is an error; every filter chain there
ends in an inline connection manager, every HTTP and listener filter is of a known type
(``rules.filter_types``, ``rules.closure``), a decided route reaches only static
clusters it names, and no listener without this processor's filter reaches a policed
upstream unless its clusters are proven apart (``rules.closure``). With
``--processor-config``, the processor's cluster verifies the processor by name and
presents Envoy's certificate where the processor demands one (``rules.processor_tls``).

Each problem is a ``Finding`` (``findings``): a stable code, a place, a severity and a
message; errors fail the check. ``reader`` reads the bootstrap, ``effective`` gives a
filter's setting on a route as Envoy picks it, ``selection`` simulates route selection,
``rules`` judge, ``check`` applies them in order and ``cli`` prints them."""

from ext_proc.tools.check_envoy.check import check
from ext_proc.tools.check_envoy.cli import main
from ext_proc.tools.check_envoy.findings import CODES, Finding, Report
from ext_proc.tools.check_envoy.reader import EXT_PROC

__all__ = ["CODES", "EXT_PROC", "Finding", "Report", "check", "main"]
