"""A header that chooses a route is stated once, with one value, or the request is refused.

A route may match a request header by its value (``RouteInput.headers``: llm-d's
``EPP-Profile``, which names the coordinator's phase). Envoy 1.40 matches a header
sent twice value by value, so ``EPP-Profile: decode`` and ``EPP-Profile: prefill`` in
one request take the first route that matches either (the prefill route), while a
component behind the gateway (llm-d's endpoint picker) may read the other value, or
both; a comma-separated list in one header is yet another reading. Whichever phase the
request is then routed and policed as, the client stated two: the gateway refuses it
rather than choose (docs/trust.md, "One phase per request").

Envoy's route matchers cannot count a header's values, but its CEL attributes join them
with ``,`` (``request.headers['epp-profile']`` reads ``decode,prefill``): an RBAC
filter, before the processor's, denies a request whose joined value holds a comma, and
a local reply mapper (``output.local_reply_config``) turns that denial into a 400 in
vLLM's error shape. An absent header leaves the condition without a value: no match,
the request goes on. Matched values hold no comma (``inputs``), so no route is lost.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Final

with warnings.catch_warnings():
    # envoy-data-plane 2.2's classes warn under pydantic >= 2.12 (see output.py).
    from pydantic.warnings import PydanticDeprecatedSince212

    warnings.simplefilter("ignore", PydanticDeprecatedSince212)
    from envoy_data_plane.envoy.config.rbac import v3 as rbac
    from envoy_data_plane.envoy.extensions.filters.http.rbac import v3 as rbac_filter
    from envoy_data_plane.google.api.expr import v1alpha1 as expr

FILTER: Final = "envoy.filters.http.rbac"
# What Envoy's RBAC filter writes as the response code details of a denial.
_DENIED: Final = "rbac_access_denied_matched_policy[{policy}]"


def selecting(headers: Iterable[Iterable[str]]) -> list[str]:
    """The header names routes match on (each route's names given), once each, sorted."""
    return sorted({name for names in headers for name in names})


def policy(header: str) -> str:
    """The name of the RBAC policy that refuses ``header`` stated more than once."""
    return f"{header}-stated-twice"


def denial_details(header: str) -> str:
    """The response code details of that refusal (what the local reply mapper matches,
    and the access log's ``details``)."""
    return _DENIED.format(policy=policy(header))


def message(header: str) -> str:
    """What the client is told."""
    return (
        f"the {header} header chooses this request's route: send it once, with one value "
        "(it was sent twice, or with a list)"
    )


def _joined_holds_comma(header: str) -> expr.Expr:
    """CEL ``request.headers['<header>'].contains(',')`` as the parsed expression RBAC
    takes: Envoy joins a header's values with ``,`` in ``request.headers``."""
    headers = expr.Expr(
        select_expr=expr.ExprSelect(
            operand=expr.Expr(ident_expr=expr.ExprIdent(name="request")), field="headers"
        )
    )
    value = expr.Expr(
        call_expr=expr.ExprCall(
            function="_[_]",
            args=[headers, expr.Expr(const_expr=expr.Constant(string_value=header))],
        )
    )
    return expr.Expr(
        call_expr=expr.ExprCall(
            target=value,
            function="contains",
            args=[expr.Expr(const_expr=expr.Constant(string_value=","))],
        )
    )


def rbac_config(headers: Iterable[str]) -> rbac_filter.Rbac:
    """The filter's settings: one denying policy per header, any caller, any request."""
    return rbac_filter.Rbac(
        rules=rbac.Rbac(
            action=rbac.RbacAction.DENY,
            policies={
                policy(header): rbac.Policy(
                    permissions=[rbac.Permission(any=True)],
                    principals=[rbac.Principal(any=True)],
                    condition=_joined_holds_comma(header),
                )
                for header in headers
            },
        )
    )
