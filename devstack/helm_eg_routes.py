"""The chart's Envoy Gateway wiring for the routes its values name (``gateway.routes``,
``gateway.hosts``): the EnvoyPatchPolicy's patches of each route, taken from the
patches deploy/envoy-gateway/patch-policy.yaml gives its example routes, one source for
each action's patches.

A route of ``gateway.routes`` gets the patches of the example route with the same
action (its policy as route metadata, the body limit as its
``request_body_buffer_limit``, the mint route's response processing override), its
policy in place of the example's. A route whose policy names a tenant source needs no
more: Envoy Gateway sends the request headers on every route of an EnvoyExtensionPolicy
that processes the request (``processingMode.request``).

Not scoped: the EnvoyExtensionPolicy targets the Gateway, so every route of it runs the
processor, and a route without a policy gets the strictest one (aggregated, strip).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Final

from ext_proc.core.route_policy import DEFAULT_NAMESPACE

# An example route's patch: its JSONPath names the route (Envoy Gateway's
# ``httproute/<namespace>/<name>/rule/<rule>/match/<match>/<hostname or *>``).
_ROUTE_PATH: Final = re.compile(r"^\.\.routes\[\?\(@\.name=='(httproute/[^']+)'\)\]$")
POLICY_PATH: Final = f"/metadata/filter_metadata/{DEFAULT_NAMESPACE}"
# The placeholders helm._holes writes for the body limit and the release namespace.
MAX_BODY_HOLE: Final = "__MAX_BODY_1__"
NAMESPACE_HOLE: Final = "__RELEASE_NAMESPACE__"


def shapes(patches: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The operations each action's route gets, read off the example routes' patches
    (names already made placeholders): each ``{path, value, fill}``, ``fill`` saying
    which value the chart writes there (``policy``: the route's; ``max``: the body
    limit; empty: ``value`` as it is)."""
    by_route: dict[str, list[dict[str, Any]]] = {}
    for patch in patches:
        if not isinstance(patch, dict):
            continue
        found = _ROUTE_PATH.match(str(patch["operation"].get("jsonPath", "")))
        if found is not None:
            by_route.setdefault(found.group(1), []).append(patch["operation"])
    out: dict[str, list[dict[str, Any]]] = {}
    for name, operations in by_route.items():
        (policy,) = [o["value"] for o in operations if o["path"] == POLICY_PATH]
        shape = []
        for operation in operations:
            if operation["op"] != "add":
                raise ValueError(f"{name}: {operation['op']} is not an add")
            fill = ""
            if operation["path"] == POLICY_PATH:
                fill = "policy"
            elif operation["value"] == MAX_BODY_HOLE:
                fill = "max"
            value = None if fill else copy.deepcopy(operation["value"])
            shape.append({"path": operation["path"], "value": value, "fill": fill})
        if out.setdefault(policy["action"], shape) != shape:
            raise ValueError(f"{name}: another shape for the action {policy['action']}")
    return out


def _json(value: Any) -> str:
    """``value`` as a Go template string literal of its JSON."""
    return json.dumps(json.dumps(value, separators=(",", ":")))


# A route named by gateway.routes, as Envoy Gateway names it: an httpRoute's rule, each
# of its matches (``matches``, 1 unless given) in each of its hostnames (dots as '_';
# none: the HTTPRoute names no hostname, '*'), or an envoyRoute's name as it is. An
# Ingress is not Envoy Gateway's.
_NAMES: Final = """\
  {{- $names := list }}
  {{- if $route.httpRoute }}
  {{- $rule := $route.httpRoute }}
  {{- $namespace := $rule.namespace | default $.Release.Namespace }}
  {{- $rule_name := printf "httproute/%s/%s/rule/%d" $namespace $rule.name (int $rule.rule) }}
  {{- range $match := until (int ($rule.matches | default 1)) }}
  {{- range $host := $rule.hostnames | default (list "*") }}
  {{- $names = append $names (printf "%s/match/%d/%s" $rule_name $match (replace "." "_" $host)) }}
  {{- end }}
  {{- end }}
  {{- else if $route.envoyRoute }}
  {{- $names = list $route.envoyRoute }}
  {{- else }}
  {{- fail "gateway.routes: gateway.kind envoyGateway takes httpRoute or envoyRoute items" }}
  {{- end }}
"""


def routes_block(shaped: dict[str, list[dict[str, Any]]], indent: str) -> str:
    """The EnvoyPatchPolicy's patches of the routes of gateway.routes, as list items at
    ``indent``, for the listener ``<release namespace>/<gateway.name>/http``."""
    lines = [
        f"{{{{- $egShapes := fromJson {_json(shaped)} }}}}",
        '{{- range $host := .Values.gateway.hosts }}{{ if contains ":" $host }}',
        '{{- fail "gateway.hosts: gateway.kind envoyGateway names a hostname of the'
        ' HTTPRoutes, without a port" }}',
        "{{- end }}{{ end }}",
        "{{- range $route := .Values.gateway.routes }}",
        *_NAMES.rstrip("\n").split("\n"),
        "{{- range $name := $names }}",
        "{{- range $op := get $egShapes $route.policy.action }}",
        "{{- $value := $op.value }}",
        '{{- if eq $op.fill "policy" }}{{ $value = $route.policy }}'
        '{{ else if eq $op.fill "max" }}{{ $value = int64 $.Values.config.maxBodyBytes }}'
        "{{ end }}",
        "- type: type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "  name: {{ $.Release.Namespace }}/{{ $.Values.gateway.name }}/http",
        "  operation:",
        "    op: add",
        "    jsonPath: {{ printf \"..routes[?(@.name=='%s')]\" $name | quote }}",
        f'    path: {{{{ replace "{NAMESPACE_HOLE}" $.Release.Namespace $op.path | quote }}}}',
        "    value: {{ toJson $value }}",
        "{{- end }}",
        "{{- end }}",
        "{{- end }}",
    ]
    return "\n".join(
        f"{indent}{line.strip()}" if line.strip().startswith("{{") else f"{indent}{line}"
        for line in lines
    )
