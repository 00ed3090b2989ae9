"""``python -m devstack helm``: the generated parts of the Helm chart
(``deploy/helm/ext-proc-token-policy/``), and the kustomize base rendered from it.

One source for each fact:

- the gateway wiring (Istio EnvoyFilter, Envoy Gateway policies, the example HTTPRoutes,
  llm-d's coordinator manifests) is written once under ``deploy/`` (by hand, or by the
  ``classified`` and ``llm-d`` generators); the chart's ``templates/gateway-*.yaml`` are
  those objects with the release namespace, the gateway's name, its pods' labels and the
  cluster domain made template values, each behind its ``gateway.kind``;
- the chart's ``templates/prometheusrule.yaml`` is ``deploy/monitoring/rules.yaml``'s
  PrometheusRule (``devstack/monitoring.py``), its alert templates escaped for Helm;
- the processor's objects are written once, as the chart's templates; the kustomize
  base ``deploy/kubernetes/*.yaml`` is their render with the chart's default values (in
  the base's namespace), so ``kubectl apply -k`` and ``helm install`` install the same;
- the values table of the chart's README.md is read off values.yaml and
  values.schema.json.

The chart is the source of the processor's objects, not the base: a template carries the
choices (an external Redis, no autoscaler, other gateway namespaces) that a rendered
base has made. tests/test_generated.py fails when a committed file differs from what
this writes."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import helm_python
import yaml

from devstack import helm_eg_routes, helm_routes, llmd, monitoring
from devstack.markers import splice
from ext_proc.tools import envoygen

REPO: Final = Path(__file__).resolve().parents[1]
DEPLOY: Final = REPO / "deploy"
CHART: Final = DEPLOY / "helm" / "ext-proc-token-policy"
TEMPLATES: Final = CHART / "templates"
BASE: Final = DEPLOY / "kubernetes"
README: Final = CHART / "README.md"
# The base's namespace and release name (deploy/kubernetes/kustomization.yaml).
BASE_NAMESPACE: Final = "llm-d"
RELEASE: Final = "ext-proc-token-policy"
# The chart's templates the base is rendered from: the processor's objects that the
# default values render (the gateway wiring and monitoring are off by default).
BASE_FILES: Final = (
    "serviceaccount.yaml",
    "configmap.yaml",
    "deployment.yaml",
    "service.yaml",
    "poddisruptionbudget.yaml",
    "horizontalpodautoscaler.yaml",
    "networkpolicy.yaml",
    "redis.yaml",
)

# What the shipped manifests name and the chart makes a value. The namespace is a whole
# segment of a name (``llm-d.llama.0``, ``httproute/llm-d/...``, ``~1llm-d~1`` in a JSON
# pointer, ``...headless.llm-d.svc``), never the prefix of another name
# (``llm-d-coordinator``).
_NAMESPACE = re.compile(r"(?:(?<=~1)|(?<![\w-]))" + re.escape(llmd.NAMESPACE) + r"(?![\w-])")
_GATEWAY = re.compile(r"(?<![\w-])" + re.escape(llmd.GATEWAY) + r"(?![\w-])")
_DOMAIN = re.compile(r"(?<=\.svc\.)cluster\.local$")
# The processor's objects: the release's fullname (its Services, the EnvoyFilter).
_FULLNAME = re.compile(r"(?<![\w.-])" + re.escape(RELEASE) + r"(?=$|-headless\.|\.)")
# The body limit (config.maxBodyBytes) and what the shipped wiring derives from it: the
# processor cluster's HTTP/2 stream window (twice), its connection window and the gRPC
# message a rewritten body may grow to (four times); in bytes, and as Envoy Gateway's
# quantities.
MAX_BODY: Final = 16 * 1024 * 1024
_BODY_LIMITS: Final = {MAX_BODY * n: f"__MAX_BODY_{n}__" for n in (1, 2, 4)}
_BODY_QUANTITIES: Final = {f"{MAX_BODY * n // 2**20}Mi": f"__MAX_BODY_MI_{n}__" for n in (1, 2, 4)}
_MAX = "(int64 .Values.config.maxBodyBytes)"
# The processor cluster's max_outbound_frames follows the body limit as
# envoygen.processor_outbound_frames computes it: the shipped wiring's value at MAX_BODY
# becomes the same sum of the limit's frames in the template.
_FRAMES: Final = envoygen.processor_outbound_frames(MAX_BODY)
_FRAMES_HOLE: Final = "__OUTBOUND_FRAMES__"


def _outbound_frames() -> str:
    """processor_outbound_frames of the body limit, as a template action."""
    frame = envoygen.ENVOY_DATA_FRAME_BYTES
    message = f"(add {_MAX} {envoygen.MESSAGE_OVERHEAD_BYTES} {frame - 1})"
    frames = f"(mul {envoygen.PROCESSOR_STREAMS} (div {message} {frame}))"
    return f"{{{{ add {frames} {envoygen.ENVOY_OUTBOUND_FRAMES} }}}}"


def _quantity(times: str) -> str:
    """``times`` the body limit as a Kubernetes quantity: in Mi where it is whole."""
    q = f"$q{times}"
    whole = f"{{{{ if mod {q} 1048576 }}}}{{{{ {q} }}}}{{{{ else }}}}{{{{ div {q} 1048576 }}}}Mi"
    return f"{{{{ {q} := mul {_MAX} {times} }}}}{whole}{{{{ end }}}}"


_HOLES: Final = {
    "__RELEASE_NAMESPACE__": "{{ .Release.Namespace }}",
    "__GATEWAY_NAME__": "{{ .Values.gateway.name }}",
    "__CLUSTER_DOMAIN__": "{{ .Values.gateway.clusterDomain }}",
    "__FULLNAME__": '{{ include "ext-proc-token-policy.fullname" $ }}',
    **{hole: f"{{{{ mul {_MAX} {hole[-3]} }}}}" for hole in _BODY_LIMITS.values()},
    **{hole: _quantity(hole[-3]) for hole in _BODY_QUANTITIES.values()},
    _FRAMES_HOLE: _outbound_frames(),
}
_POD_LABELS = "__GATEWAY_POD_LABELS__"
_POD_LABELS_LINE = re.compile(rf"^( *)(\S+): {_POD_LABELS}$", re.MULTILINE)
_HEADER = """\
# Generated by `make generate` from {sources}: edit those.
# The release namespace, gateway.name, gateway.podLabels and gateway.clusterDomain take
# the place of the names they give; the comments there say why each part is as it is.
"""
_RULE_HEADER = """\
# Generated by `make generate` from deploy/monitoring/rules.yaml: edit that file.
# The alerts and what to do when one fires: docs/operations.md#alerts.
"""
_BASE_HEADER = """\
# Generated by `make generate`: the Helm chart's templates/{name} rendered with its
# default values (deploy/helm/ext-proc-token-policy): edit the chart.
"""
# The processor's cluster in every wiring presents Envoy's client certificate and
# verifies the processor's (values tls, templates/tls.yaml), from the Secret
# ext-proc-token-policy-envoy that the gateway's Envoy pods mount at ENVOY_CERTS; the
# shipped deploy/ wiring (the kustomize base's) stays plain h2c. Envoy Gateway makes the
# cluster of an EnvoyExtensionPolicy itself: a patch of the EnvoyPatchPolicy adds it.
ENVOY_CERTS: Final = "/etc/ext-proc-token-policy/envoy"
PROCESSOR_CLUSTER: Final = "ext_proc_token_policy"
_PROCESSOR_NAME = "ext-proc-token-policy.__RELEASE_NAMESPACE__.svc"
PROCESSOR_TLS: Final = {
    "name": "envoy.transport_sockets.tls",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "sni": _PROCESSOR_NAME,
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [
                {
                    "certificate_chain": {"filename": f"{ENVOY_CERTS}/tls.crt"},
                    "private_key": {"filename": f"{ENVOY_CERTS}/tls.key"},
                }
            ],
            "validation_context": {
                "trusted_ca": {"filename": f"{ENVOY_CERTS}/ca.crt"},
                "match_typed_subject_alt_names": [
                    {"san_type": "DNS", "matcher": {"exact": _PROCESSOR_NAME}}
                ],
            },
        },
    },
}
_TLS_ON = "__TLS_ON__"
_TLS_END = "__TLS_END__"
_EXAMPLES_ON = "__EXAMPLES_ON__"
_SOCKET = "__PROCESSOR_TLS__"
_SOCKET_PATCH = "__PROCESSOR_TLS_PATCH__ "
# The marked key (``transport_socket: __PROCESSOR_TLS__``) and list item
# (``- __PROCESSOR_TLS_PATCH__ <cluster>``).
_SOCKET_KEY = re.compile(rf"^( *)(\S+): {_SOCKET}$", re.MULTILINE)
_SOCKET_ITEM = re.compile(rf"^( *)- {_SOCKET_PATCH}(\S+)$", re.MULTILINE)
VALUES_BEGIN: Final = "<!-- values: generated by `make generate` from values.yaml -->"
VALUES_END: Final = "<!-- end of values -->"


def _escaped(text: str) -> str:
    """Text Helm writes as it is: a ``{{`` of the source (Prometheus' alert templates)
    becomes an action that prints it."""
    return text.replace("{{", '{{ "{{" }}')


def _holes(value: Any) -> Any:
    """``value`` with each name the chart makes a value replaced by its placeholder."""
    if isinstance(value, dict):
        return {key: _holes(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_holes(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and value in _BODY_LIMITS:
        return _BODY_LIMITS[value]
    if isinstance(value, int) and not isinstance(value, bool) and value == _FRAMES:
        return _FRAMES_HOLE
    if isinstance(value, str) and value in _BODY_QUANTITIES:
        return _BODY_QUANTITIES[value]
    if isinstance(value, str):
        value = _FULLNAME.sub("__FULLNAME__", value)
        value = _NAMESPACE.sub("__RELEASE_NAMESPACE__", value)
        value = _GATEWAY.sub("__GATEWAY_NAME__", value)
        return _DOMAIN.sub("__CLUSTER_DOMAIN__", value)
    return value


def _processor_tls(document: dict[str, Any], clusters: list[str]) -> None:
    """Marks where the processor's cluster takes its TLS socket: an EnvoyFilter's
    CLUSTER patch adding it; for an EnvoyPatchPolicy, a patch of each cluster of
    ``clusters`` (Envoy Gateway's names for the EnvoyExtensionPolicy's), added last."""
    for patch in document.get("spec", {}).get("configPatches", []):
        value = patch["patch"].get("value", {})
        if patch["applyTo"] == "CLUSTER" and value.get("name") == PROCESSOR_CLUSTER:
            value["transport_socket"] = _SOCKET
    if document.get("kind") == "EnvoyPatchPolicy":
        document["spec"]["jsonPatches"] += [_SOCKET_PATCH + name for name in clusters]


def _dumped(value: Any) -> str:
    return yaml.dump(value, Dumper=llmd._Plain, sort_keys=False, width=1000)


def _guarded(indent: str, body: list[str]) -> str:
    """``body`` rendered unless values tls.mode is none."""
    return "\n".join([f"{indent}{_TLS_ON}", *body, f"{indent}{_TLS_END}"])


def _socket(found: re.Match[str]) -> str:
    """The marked key: the processor's cluster's transport socket."""
    indent, key = found.group(1), found.group(2)
    socket = _dumped(_holes(PROCESSOR_TLS)).splitlines()
    return _guarded(indent, [f"{indent}{key}:"] + [f"{indent}  {line}" for line in socket])


def _socket_patch(found: re.Match[str]) -> str:
    """The marked list item: an EnvoyPatchPolicy's patch adding the transport socket
    to the cluster named."""
    indent, cluster = found.group(1), found.group(2)
    patch = {
        "type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": cluster,
        "operation": {"op": "add", "path": "/transport_socket", "value": _holes(PROCESSOR_TLS)},
    }
    return _guarded(indent, [indent + line for line in _dumped([patch]).splitlines()])


_EXAMPLE = "__EXAMPLE_PATCH__ "
_EXAMPLE_ITEM = re.compile(rf"^( *)- {_EXAMPLE}(\d+)$", re.MULTILINE)
# An EnvoyPatchPolicy's patch of an example route (deploy/envoy-gateway/httproutes.yaml).
_EXAMPLE_PATH = "..routes[?(@.name=='httproute/"
# An EnvoyPatchPolicy's patch of the listener's virtual host '*' (the refused endpoints'
# 404s), made one per virtual host of gateway.hosts ('*' without, and with the examples).
_VHOST = "__VHOST_PATCH__ "
_VHOST_ITEM = re.compile(rf"^( *)- {_VHOST}(\d+)$", re.MULTILINE)
_VHOST_PATH = "..virtual_hosts[?(@.name=="
_VHOST_NAME = "__VHOST__"
_VHOSTS = (
    '{{- range $vhost := uniq (concat ($.Values.gateway.hosts | default (list "*"))'
    ' (ternary (list "*") (list) $.Values.gateway.examples)) }}'
)


def _hosts_gated(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Marks each of an EnvoyPatchPolicy's patches of the virtual host '*'; the patches
    marked, by index, their virtual host's name a placeholder."""
    patches = document["spec"]["jsonPatches"]
    found: list[dict[str, Any]] = []
    for index, patch in enumerate(patches):
        if not isinstance(patch, dict):  # a marked patch of an example route
            continue
        path = str(patch["operation"].get("jsonPath", ""))
        if path.startswith(_VHOST_PATH) and path.endswith("/*')]"):
            patch["operation"]["jsonPath"] = path.removesuffix("*')]") + f"{_VHOST_NAME}')]"
            patches[index] = f"{_VHOST}{len(found)}"
            found.append(patch)
    return found


def _vhost_patches(patch: dict[str, Any], indent: str) -> str:
    """``patch`` once per virtual host (Envoy Gateway's name: the listener's and the
    hostname, dots as '_'), the chart's names read from the root context."""
    text = _escaped(_dumped([patch]))
    for hole, action in _HOLES.items():
        text = text.replace(hole, re.sub(r"(?<=[\s(])\.(Values|Release)", r"$.\1", action))
    text = text.replace(_VHOST_NAME, '{{ replace "." "_" $vhost }}')
    lines = [indent + line for line in text.splitlines()]
    return "\n".join([indent + _VHOSTS, *lines, f"{indent}{{{{- end }}}}"])


# Where an EnvoyPatchPolicy with example route patches takes those of gateway.routes.
_ROUTES = "__GATEWAY_ROUTES__"
_ROUTES_ITEM = re.compile(rf"^( *)- {_ROUTES}$", re.MULTILINE)


def _examples_gated(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Marks each of an EnvoyPatchPolicy's patches of an example route (rendered only
    with gateway.examples); the patches marked, by index."""
    patches = document["spec"]["jsonPatches"]
    found: list[dict[str, Any]] = []
    for index, patch in enumerate(patches):
        if str(patch["operation"].get("jsonPath", "")).startswith(_EXAMPLE_PATH):
            patches[index] = f"{_EXAMPLE}{len(found)}"
            found.append(patch)
    return found


def _template(
    document: dict[str, Any], clusters: list[str] | None = None, examples: bool = False
) -> str:
    """One object as template text: the names made values, the gateway pods' labels
    (an Istio workloadSelector) the chart's helper, the processor's cluster's TLS
    behind values tls; ``examples``: an EnvoyPatchPolicy's patches of the example routes
    behind values gateway.examples."""
    document = _holes(document)
    gated = _examples_gated(document) if examples and document["kind"] == "EnvoyPatchPolicy" else []
    vhosted = _hosts_gated(document) if gated else []
    if gated:
        document["spec"]["jsonPatches"].append(_ROUTES)
    selector = document.get("spec", {}).get("workloadSelector")
    if selector is not None:
        selector["labels"] = _POD_LABELS
    _processor_tls(document, [_holes(name) for name in clusters or []])
    text = _SOCKET_ITEM.sub(_socket_patch, _SOCKET_KEY.sub(_socket, _dumped(document)))

    def example(found: re.Match[str]) -> str:
        indent, patch = found.group(1), gated[int(found.group(2))]
        lines = [indent + line for line in _dumped([patch]).splitlines()]
        return "\n".join([f"{indent}{_EXAMPLES_ON}", *lines, f"{indent}{_TLS_END}"])

    text = _EXAMPLE_ITEM.sub(example, text)
    text = _escaped(text).replace(_TLS_ON, '{{- if ne .Values.tls.mode "none" }}')
    text = text.replace(_TLS_END, "{{- end }}")
    text = text.replace(_EXAMPLES_ON, "{{- if .Values.gateway.examples }}")
    for hole, action in _HOLES.items():
        text = text.replace(hole, action)
    # The routes of gateway.routes get the example routes' patches of their action.
    shaped = helm_eg_routes.shapes(gated)
    text = _ROUTES_ITEM.sub(lambda found: helm_eg_routes.routes_block(shaped, found[1]), text)
    text = _VHOST_ITEM.sub(lambda found: _vhost_patches(vhosted[int(found[2])], found[1]), text)

    def labels(found: re.Match[str]) -> str:
        indent, key = found.group(1), found.group(2)
        include = '{{- include "ext-proc-token-policy.gatewayPodLabels" . | nindent '
        return f"{indent}{key}:\n{indent}  {include}{len(indent) + 2} }}}}"

    return _POD_LABELS_LINE.sub(labels, text)


def _sources(paths: Iterable[Path]) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(path.relative_to(REPO).as_posix(), llmd._documents(path)) for path in paths]


def _gateway_template(
    condition: str, blocks: list[tuple[str, list[Path]]], examples: bool = False
) -> str:
    """``blocks``: each an inner condition (or "") and the files rendered under it;
    ``examples``: the patches of the example routes behind gateway.examples."""
    names = [p.relative_to(REPO).as_posix() for _, paths in blocks for p in paths]
    out = [_HEADER.format(sources=", ".join(names)), f"{{{{- if {condition} }}}}\n"]
    if "gateway.kind" in condition and not examples and "examples" not in condition:
        out.append(_ISTIO_ONLY)
    for inner, paths in blocks:
        if inner:
            out.append(f"{{{{- if {inner} }}}}\n")
        sources = _sources(paths)
        # Envoy Gateway's name for each EnvoyExtensionPolicy's cluster
        # (internal/xds/translator: envoyextensionpolicy/<namespace>/<name>/<index>).
        clusters = [
            f"envoyextensionpolicy/{d['metadata']['namespace']}/{d['metadata']['name']}/{i}"
            for _, documents in sources
            for d in documents
            if d.get("kind") == "EnvoyExtensionPolicy"
            for i, _ in enumerate(d["spec"]["extProc"])
        ]
        for _, documents in sources:
            for document in documents:
                out.append("---\n" + _template(document, clusters, examples))
        if inner:
            out.append("{{- end }}\n")
    out.append("{{- end }}\n")
    return "".join(out)


# Routes and hosts from values are the Istio and Envoy Gateway wirings': llm-d's would
# leave them to its own policy (its coordinator routes'), not the one they state.
_ISTIO_ONLY: Final = (
    "{{- if or .Values.gateway.routes .Values.gateway.hosts }}\n"
    '{{- fail "gateway.routes and gateway.hosts are rendered by gateway.kind istio and'
    ' envoyGateway only" }}\n'
    "{{- end }}\n"
)
_COORDINATOR = llmd.OUTPUT
GATEWAY_TEMPLATES: Final = {
    "gateway-envoy-gateway.yaml": (
        'eq .Values.gateway.kind "envoyGateway"',
        [
            (
                "",
                [
                    DEPLOY / "envoy-gateway" / "extension-policy.yaml",
                    DEPLOY / "envoy-gateway" / "patch-policy.yaml",
                ],
            )
        ],
    ),
    "gateway-httproutes.yaml": (
        'and .Values.gateway.examples (has .Values.gateway.kind (list "istio" "envoyGateway"))',
        [("", [DEPLOY / "envoy-gateway" / "httproutes.yaml"])],
    ),
    "gateway-llmd.yaml": (
        'eq .Values.gateway.kind "llmd"',
        [
            ("", [_COORDINATOR / "routes" / "httproute.yaml"]),
            (
                'eq .Values.gateway.llmdProvider "istio"',
                [_COORDINATOR / "istio" / "envoyfilter.yaml"],
            ),
            (
                'eq .Values.gateway.llmdProvider "envoyGateway"',
                [
                    _COORDINATOR / "envoy-gateway" / "extension-policy.yaml",
                    _COORDINATOR / "envoy-gateway" / "patch-policy.yaml",
                ],
            ),
        ],
    ),
}


# Rendered from the shipped Istio wiring by helm_routes (the routes of the values).
ISTIO: Final = "gateway-istio.yaml"
# The template whose EnvoyPatchPolicy patches the example routes by name.
EXAMPLES_GATED: Final = "gateway-envoy-gateway.yaml"


def prometheus_rule_template() -> str:
    document = monitoring.prometheus_rule(yaml.safe_load(monitoring.RULES.read_text()))
    document["metadata"]["name"] = "__FULLNAME__"
    document["metadata"]["namespace"] = "__RELEASE_NAMESPACE__"
    document["metadata"]["labels"] = "__LABELS__"
    text = yaml.dump(document, Dumper=monitoring._Dumper, sort_keys=False, width=1000)
    text = _escaped(text).replace("__RELEASE_NAMESPACE__", "{{ .Release.Namespace }}")
    text = text.replace("__FULLNAME__", '{{ include "ext-proc-token-policy.fullname" . }}')
    labels = (
        '\n    {{- include "ext-proc-token-policy.labels" . | nindent 4 }}'
        "\n    {{- with .Values.monitoring.prometheusRule.labels }}"
        "\n    {{- toYaml . | nindent 4 }}"
        "\n    {{- end }}"
    )
    text = text.replace(" __LABELS__", labels)
    condition = "{{- if .Values.monitoring.prometheusRule.enabled }}\n"
    return _RULE_HEADER + condition + text + "{{- end }}\n"


def templates() -> dict[Path, str]:
    """The chart's generated templates."""
    out = {
        TEMPLATES / name: _gateway_template(condition, blocks, name == EXAMPLES_GATED)
        for name, (condition, blocks) in GATEWAY_TEMPLATES.items()
    }
    out[TEMPLATES / ISTIO] = helm_routes.istio_template(_template)
    out[TEMPLATES / "prometheusrule.yaml"] = prometheus_rule_template()
    return out


def render(
    values: dict[str, Any] | None = None,
    namespace: str = BASE_NAMESPACE,
    chart: Path = CHART,
    generated: dict[Path, str] | None = None,
    release: str = RELEASE,
) -> dict[str, str]:
    """The chart's render: each template's name (``deployment.yaml``) and its text, the
    manifests only (``NOTES.txt``: ``notes``). ``generated``: template texts that take
    the place of the committed ones (so the base follows what this run writes)."""
    rendered = _rendered(values, namespace, chart, generated, release)
    rendered.pop("NOTES.txt", None)
    return rendered


def notes(
    values: dict[str, Any] | None = None,
    namespace: str = BASE_NAMESPACE,
    release: str = RELEASE,
) -> str:
    """What ``helm install`` prints: the chart's NOTES.txt rendered."""
    return _rendered(values, namespace, CHART, None, release)["NOTES.txt"]


def _rendered(
    values: dict[str, Any] | None,
    namespace: str,
    chart: Path,
    generated: dict[Path, str] | None,
    release: str,
) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / chart.name
        shutil.copytree(chart, copy)
        for path, text in (generated or {}).items():
            (copy / path.relative_to(chart)).write_text(text)
        rendered = helm_python.Chart.load(copy).render(values, name=release, namespace=namespace)
    prefix = f"{chart.name}/templates/"
    return {name.removeprefix(prefix): text for name, text in rendered.items()}


# The base goes with the shipped deploy/ wiring, which reaches the processor over plain
# h2c behind the NetworkPolicy; its Secrets (the proof keys, ext-proc-redis-auth) are
# created beside it (deploy/README.md): the chart's generated ones differ at each render.
BASE_VALUES: Final = {"tls": {"mode": "none"}}


def base(generated: dict[Path, str] | None = None) -> dict[Path, str]:
    rendered = render(BASE_VALUES, generated=generated)
    return {
        BASE / name: _BASE_HEADER.format(name=name) + rendered[name].lstrip("\n")
        for name in BASE_FILES
    }


def _leaves(
    values: dict[str, Any], schema: dict[str, Any], prefix: str = ""
) -> Iterable[tuple[str, Any, str]]:
    """Each value the table lists: a mapping whose schema describes it as a whole is
    one row, any other is its members' rows."""
    for key, value in values.items():
        member = schema["properties"][key]
        path = f"{prefix}{key}"
        if "properties" in member and "description" not in member:
            yield from _leaves(value, member, path + ".")
            continue
        if "description" not in member:
            raise ValueError(f"values.schema.json: {path} has no description")
        yield path, value, member["description"]


def values_table() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    rows = ["| value | default | what it does |", "|---|---|---|"]
    for path, value, description in _leaves(values, schema):
        default = json.dumps(value, separators=(", ", ": "))
        cell = description.replace("|", "\\|")  # a "|" would end the cell
        rows.append(f"| `{path}` | `{default}` | {cell} |")
    return "\n".join(rows)


# Every file ``files()`` writes, listed without generating them.
OUTPUTS: Final = (
    *(TEMPLATES / name for name in GATEWAY_TEMPLATES),
    TEMPLATES / ISTIO,
    TEMPLATES / "prometheusrule.yaml",
    *(BASE / name for name in BASE_FILES),
    README,
    CHART / "values.schema.json",
)


SCHEMA: Final = CHART / "values.schema.json"


def values_schema() -> str:
    """values.schema.json with its route policy (``definitions.routePolicy``) read off
    the processor's declaration."""
    schema = json.loads(SCHEMA.read_text())
    schema["definitions"]["routePolicy"] = helm_routes.route_policy_schema()
    return json.dumps(schema, indent=2) + "\n"


def files() -> dict[Path, str]:
    generated = templates()
    readme = splice(README.read_text(), VALUES_BEGIN, VALUES_END, values_table())
    return {**generated, **base(generated), README: readme, SCHEMA: values_schema()}
