"""The chart's Istio wiring for the routes its values name (``gateway.routes``,
``gateway.hosts``), generated from the shipped deploy/istio/envoyfilter.yaml: one source
for every patch, the shipped file staying the example for the example routes.

Scoped to what it polices, so a shared gateway's other routes are left as they are:

- the header step, this processor's filter and the buffer filter are inserted disabled
  (``HttpFilter.disabled``) and enabled, each by a ``FilterConfig`` whose empty config
  enables a filter disabled by default (the real Envoy takes it; a ``FilterConfig`` with
  only ``disabled: false`` is refused as an empty per-filter configuration), on every
  route of a policed virtual host (``gateway.hosts``) and on each policed route
  (``gateway.routes``); a route's name is no proof of whose it is (a VirtualService
  names its http routes freely), so its policy goes to the route of that name in the
  policed hosts only, and one elsewhere runs the filters without a policy (strip);
- a policed route gets what the shipped patch of an example route with the same action
  gives it (its retry policy, the mint route's response processing), its policy as
  route metadata and the body limit as its ``request_body_buffer_limit``;
- a route whose policy names a tenant source sends the processor its request headers
  (a request without a body is judged too, and llm-d's fairness id written);
- the refused endpoints' 404 routes go into the policed virtual hosts only, with a 400
  route for a path the shipped connection manager patch would have changed (an escaped
  slash or backslash, ``//``), which this wiring does not set for the whole gateway;
- the header step also removes each guarded header's spelling with underscores, which
  the shipped wiring drops gateway-wide (``headers_with_underscores_action``);
- the shipped virtual host settings (the processor failures' conditional retry-after,
  a ``response_headers_to_add``) go on the policed virtual hosts and on each policed
  route, never on a connection manager or virtual host the chart does not police.

The values' route policies go into the metadata as written; the processor reads them
(``ext_proc.core.route_policy``) and values.schema.json's ``routePolicy`` is generated
from the same declaration.
"""

from __future__ import annotations

import copy
import json
import typing
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import yaml

from ext_proc.core.route_policy import DEFAULT_NAMESPACE, SCHEMA, Action, RoutePolicy

REPO: Final = Path(__file__).resolve().parents[1]
SHIPPED: Final = REPO / "deploy" / "istio" / "envoyfilter.yaml"
FILTER_CONFIG: Final = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
# The connection manager fields the shipped wiring sets for every route of the gateway,
# and what takes their place here: checked, so a new one is not dropped unseen.
MANAGER_WIDE: Final = frozenset(
    {
        "http_protocol_options",
        "common_http_protocol_options",
        "normalize_path",
        "merge_slashes",
        "path_with_escaped_slashes_action",
    }
)
# A path that normalize_path leaves and the shipped wiring's merge_slashes and
# UNESCAPE_AND_REDIRECT would have changed: answered 400 on the policed hosts, before
# any route matches it.
UNNORMALIZED: Final = {
    "name": "path-not-normalized",
    "match": {"safe_regex": {"regex": "(?i).*(//|%2f|%5c).*"}},
    "direct_response": {"status": 400},
}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _route_name(patch: dict[str, Any]) -> str | None:
    vhost = patch["match"].get("routeConfiguration", {}).get("vhost", {})
    name = vhost.get("route", {}).get("name")
    return name if isinstance(name, str) else None


def enabling(filters: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-filter configuration that enables each of ``filters`` (disabled by
    default) on a route or virtual host."""
    return {f["name"]: {"@type": FILTER_CONFIG, "config": {}} for f in filters}


def _underscored(step: dict[str, Any]) -> None:
    """The header step also removes the underscore spelling of each header it removes
    or renews, so no reader that takes '_' for '-' sees a client's copy."""
    mutations = step["typed_config"]["mutations"]["request_mutations"]
    names = [m["remove"] for m in mutations if "remove" in m]
    names += [m["append"]["header"]["key"] for m in mutations if "append" in m]
    spelt = sorted({n.replace("-", "_") for n in names} - set(names))
    # Before the last mutation, which must stay the fresh request id (check-envoy).
    mutations[-1:-1] = [{"remove": name} for name in spelt]


# The shape of a route whose policy names a tenant source: ``TENANT <action>``.
TENANT: Final = "tenant"
EXT_PROC_PER_ROUTE: Final = (
    "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
)


def _processor(value: dict[str, Any]) -> bool:
    return bool(value["typed_config"]["@type"].endswith(".ext_proc.v3.ExternalProcessor"))


def _headers_sent(shape: dict[str, Any], processor: dict[str, Any]) -> dict[str, Any]:
    """``shape`` with the processor sent the request headers (``request_header_mode``
    SEND): a tenant route's request without a body must reach it (check-envoy's
    tenant-headers-skipped), and an answer to a body alone cannot write llm-d's fairness
    id. The route's own modes where it has some (a mint route), else the filter's; the
    filter stays enabled by the policed virtual host's ``FilterConfig``."""
    out = copy.deepcopy(shape)
    configs = out["typed_per_filter_config"]
    own = configs.get(processor["name"], {})
    if own.get("@type") == EXT_PROC_PER_ROUTE:
        mode = own["overrides"]["processing_mode"]
    else:
        mode = copy.deepcopy(processor["typed_config"]["processing_mode"])
        configs[processor["name"]] = {
            "@type": EXT_PROC_PER_ROUTE,
            "overrides": {"processing_mode": mode},
        }
    mode["request_header_mode"] = "SEND"
    return out


def parts(envoy_filter: dict[str, Any]) -> dict[str, Any]:
    """The shipped EnvoyFilter taken apart: the processor's cluster, the filters
    (disabled), the routes' shapes by action, the example routes, the 404 routes."""
    patches = envoy_filter["spec"]["configPatches"]
    filters = [copy.deepcopy(p) for p in patches if p["applyTo"] == "HTTP_FILTER"]
    for patch in filters:
        patch["patch"]["value"]["disabled"] = True
        if patch["patch"]["value"]["name"] == "envoy.filters.http.header_mutation":
            _underscored(patch["patch"]["value"])
    enable = enabling([p["patch"]["value"] for p in filters])
    shapes: dict[str, dict[str, Any]] = {}
    examples = []
    for patch in patches:
        name = _route_name(patch)
        if patch["applyTo"] != "HTTP_ROUTE" or name is None:
            continue
        value = copy.deepcopy(patch["patch"]["value"])
        policy = value.pop("metadata")["filter_metadata"][DEFAULT_NAMESPACE]
        value["typed_per_filter_config"] = {**enable, **value.get("typed_per_filter_config", {})}
        if shapes.setdefault(policy["action"], value) != value:
            raise ValueError(f"{name}: another shape for the action {policy['action']}")
        _, route, rule = name.split(".")
        examples.append({"httpRoute": {"name": route, "rule": int(rule)}, "policy": policy})
    for action in Action:
        shapes.setdefault(action.value, {"typed_per_filter_config": dict(enable)})
    (processor,) = [f["patch"]["value"] for f in filters if _processor(f["patch"]["value"])]
    for action in Action:
        shapes[f"{TENANT} {action.value}"] = _headers_sent(shapes[action.value], processor)
    # The shipped virtual host settings (the processor failures' retry-after), which
    # apply to every virtual host there: here on the policed hosts and on each policed
    # route, wherever it is.
    (host,) = [
        copy.deepcopy(p["patch"]["value"]) for p in patches if p["applyTo"] == "VIRTUAL_HOST"
    ]
    if set(host) != {"response_headers_to_add"}:
        raise ValueError(f"virtual host settings not scoped: {set(host)}")
    for shape in shapes.values():
        shape.update(copy.deepcopy(host))
    inserts = [
        copy.deepcopy(p["patch"]["value"])
        for p in patches
        if p["applyTo"] == "HTTP_ROUTE" and p["patch"]["operation"] == "INSERT_FIRST"
    ]
    for patch in patches:
        if patch["applyTo"] == "NETWORK_FILTER":
            typed = set(patch["patch"]["value"]["typed_config"]) - {"@type"}
            if not typed <= MANAGER_WIDE:
                raise ValueError(f"connection manager settings not scoped: {typed - MANAGER_WIDE}")
    unnormalized = copy.deepcopy(UNNORMALIZED)
    unnormalized["typed_per_filter_config"] = inserts[0]["typed_per_filter_config"]
    return {
        "cluster": [copy.deepcopy(p) for p in patches if p["applyTo"] == "CLUSTER"],
        "filters": filters,
        "enable": enable,
        "shapes": shapes,
        "examples": examples,
        "inserts": [unnormalized, *inserts],
        "host": host,
    }


def _json(value: Any) -> str:
    """``value`` as a Go template string literal of its JSON."""
    return json.dumps(json.dumps(value, separators=(",", ":")))


_HEADER: Final = """\
# Generated by `make generate` from deploy/istio/envoyfilter.yaml (devstack/helm_routes.py):
# edit that file. The patches of its example routes are the shapes every route of
# gateway.routes gets for its action; the filters are enabled only on the routes and
# virtual hosts of gateway.routes and gateway.hosts (the comments there and in
# devstack/helm_routes.py say why each part is as it is).
"""

# The route a values item names, as an EnvoyFilter's route configuration match, in the
# virtual host ``$host``: a route's name alone says nothing of whose it is (a
# VirtualService names its http routes as it likes, team-a.pd.1 on another team's host
# among them), so an HTTPRoute rule or an Envoy route name gets its policy on the
# policed hosts only (gateway.hosts), an Ingress host's routes on that host. ``$name``:
# the route's name (``_NAME``).
_MATCH: Final = """\
          name: {{ $host | quote }}
          {{- if $route.ingress }}
          route:
            action: ROUTE
          {{- else }}
          route:
            name: {{ $name }}
          {{- end }}
"""
_NAME: Final = """\
  {{- $name := $route.envoyRoute }}
  {{- if $route.httpRoute }}
  {{- $rule := $route.httpRoute }}
  {{- $namespace := $rule.namespace | default $.Release.Namespace }}
  {{- $name = printf "%s.%s.%d" $namespace $rule.name (int $rule.rule) }}
  {{- end }}
"""
# Wherever else a route of that name is (another host of the team's HTTPRoute left out
# of gateway.hosts, or another team's route taking its name), it runs the filters
# without a policy: the strictest one (aggregated, strip; counted and alerted), never
# forwarded uninspected, never given the named route's policy. Before the policed
# hosts' patch, whose per-filter configurations (a mint route's) replace these.
_ANYWHERE: Final = """\
  {{- if not $route.ingress }}
  - applyTo: HTTP_ROUTE
    match:
      context: GATEWAY
      routeConfiguration:
        vhost:
          route:
            name: {{ $name }}
    patch:
      operation: MERGE
      value:
        request_body_buffer_limit: {{ $max }}
        typed_per_filter_config:
          {{- toYaml $enable | nindent 10 }}
  {{- end }}
"""


# The virtual host of a patch's match: the one ``range $host`` names.
_IN_HOST: Final = "          name: {{ $host | quote }}\n"


def _patch(apply_to: str, vhost: str, operation: str, *value: str) -> list[str]:
    """The lines of one EnvoyFilter patch in the gateway's context: its match's
    ``vhost`` lines (``vhost``) and its value's lines (``value``) as given."""
    return [
        f"  - applyTo: {apply_to}\n",
        "    match:\n",
        "      context: GATEWAY\n",
        "      routeConfiguration:\n",
        "        vhost:\n",
        vhost,
        "    patch:\n",
        f"      operation: {operation}\n",
        "      value:\n",
        *value,
    ]


def _yaml(value: Any) -> str:
    """``value`` as YAML lines a Go template writes as they are."""
    return yaml.dump(value, sort_keys=False, width=1000).replace("{{", '{{ "{{" }}')


def istio_template(template: Any) -> str:
    """The chart's templates/gateway-istio.yaml; ``template``: helm's ``_template``
    (one object as template text, its names made values)."""
    (envoy_filter,) = _documents(SHIPPED)
    found = parts(envoy_filter)
    head = copy.deepcopy(envoy_filter)
    head["spec"]["configPatches"] = [*found["cluster"], *found["filters"]]
    static = template(head).rstrip("\n")
    out = [
        _HEADER,
        '{{- if eq .Values.gateway.kind "istio" }}\n',
        "{{- $max := int64 .Values.config.maxBodyBytes }}\n",
        "{{- $routes := .Values.gateway.routes }}\n",
        "{{- if .Values.gateway.examples }}\n",
        f"{{{{- $routes = concat $routes (fromJsonArray {_json(found['examples'])}) }}}}\n",
        "{{- end }}\n",
        f"{{{{- $shapes := fromJson {_json(found['shapes'])} }}}}\n",
        f"{{{{- $enable := fromJson {_json(found['enable'])} }}}}\n",
        # An Ingress host's routes are all policed: its virtual host is a policed one.
        "{{- $hosts := .Values.gateway.hosts }}\n",
        "{{- range $route := $routes }}{{ if $route.ingress }}\n",
        '{{- $hosts = append $hosts (printf "%s:%d" $route.ingress.host'
        " (int ($route.ingress.port | default 80))) }}\n",
        "{{- end }}{{ end }}\n",
        "{{- range $route := $routes }}"
        "{{ if and (not $route.ingress) (not $.Values.gateway.hosts) }}\n",
        '{{- fail "gateway.routes: an httpRoute or envoyRoute is policed on the virtual hosts'
        " of gateway.hosts only (a route name may be another host's route):"
        ' name its host there" }}\n',
        "{{- end }}{{ end }}\n",
        "{{- range $route := $routes }}{{ with $route.httpRoute }}"
        "{{ if or .hostnames .matches }}\n",
        "{{- fail \"gateway.routes: an httpRoute's hostnames and matches are Envoy Gateway's"
        ' (Istio names its routes <namespace>.<name>.<rule>)" }}\n',
        "{{- end }}\n",
        "{{- end }}{{ end }}\n",
        '{{- range $host := .Values.gateway.hosts }}{{ if not (contains ":" $host) }}\n',
        '{{- fail "gateway.hosts: gateway.kind istio names a virtual host <host>:<port>" }}\n',
        "{{- end }}{{ end }}\n",
        "---\n",
        static + "\n",
        "  {{- range $host := uniq $hosts }}\n",
        *_patch(
            "VIRTUAL_HOST",
            _IN_HOST,
            "MERGE",
            "        typed_per_filter_config:\n",
            "          {{- toYaml $enable | nindent 10 }}\n",
            *(f"        {line}\n" for line in _yaml(found["host"]).splitlines()),
        ),
        *_patch("HTTP_ROUTE", _IN_HOST, "MERGE", "        request_body_buffer_limit: {{ $max }}\n"),
    ]
    for insert in reversed(found["inserts"]):
        value = _yaml(insert)
        out += _patch(
            "HTTP_ROUTE",
            _IN_HOST,
            "INSERT_FIRST",
            *(f"        {line}\n" for line in value.splitlines()),
        )
    out += [
        "  {{- end }}\n",
        "  {{- range $route := $routes }}\n",
        "  {{- $shape := $route.policy.action }}\n",
        f'  {{{{- if $route.policy.tenant }}}}{{{{ $shape = printf "{TENANT} %s" $shape }}}}'
        "{{ end }}\n",
        "  {{- $value := deepCopy (get $shapes $shape) }}\n",
        '  {{- $_ := set $value "request_body_buffer_limit" $max }}\n',
        f'  {{{{- $policy := dict "{DEFAULT_NAMESPACE}" $route.policy }}}}\n',
        '  {{- $_ := set $value "metadata" (dict "filter_metadata" $policy) }}\n',
        "  {{- $in := $hosts }}\n",
        "  {{- if $route.ingress }}\n",
        '  {{- $in = list (printf "%s:%d" $route.ingress.host'
        " (int ($route.ingress.port | default 80))) }}\n",
        "  {{- end }}\n",
        _NAME,
        _ANYWHERE,
        "  {{- range $host := uniq $in }}\n",
        *_patch("HTTP_ROUTE", _MATCH, "MERGE", "        {{- toYaml $value | nindent 8 }}\n"),
        "  {{- end }}\n",
        "  {{- end }}\n",
        "{{- end }}\n",
    ]
    return "".join(out)


# --- values.schema.json's route policy ---------------------------------------------------


def _field_schema(name: str, kind: Any) -> dict[str, Any]:
    args = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
    (base,) = args[:1]
    out: dict[str, Any]
    if isinstance(base, type) and issubclass(base, StrEnum):
        out = {"enum": [member.value for member in base]}
    elif base is bool:
        out = {"type": "boolean"}
    elif base is int:
        out = {"type": "integer", "minimum": 1}
    else:
        out = {"type": "string"}
    return {**out, "description": SCHEMA[name].doc}


def route_policy_schema() -> dict[str, Any]:
    """The schema of one route policy as values state it: the fields the processor
    reads (``ext_proc.core.route_policy``), each a scalar of Envoy's metadata."""
    hints = typing.get_type_hints(RoutePolicy)
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["action"],
        "properties": {name: _field_schema(name, hints[name]) for name in SCHEMA},
    }
