"""``python -m devstack monitoring``: the Prometheus Operator's ``PrometheusRule``,
generated from the one source of the rules, ``deploy/monitoring/rules.yaml``.

The rules file serves a plain Prometheus (``rule_files``) as it is; the operator takes
the same groups as the ``spec`` of a ``PrometheusRule``. tests/test_generated.py fails
when the committed object differs from what this writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "monitoring" / "rules.yaml"
PROMETHEUS_RULE = REPO / "deploy" / "kubernetes" / "monitoring" / "prometheusrule.yaml"
NAME = "ext-proc-token-policy"
_HEADER = """\
# Generated from deploy/monitoring/rules.yaml by `make monitoring-rules`: edit that file.
# The alerts and what to do when one fires: docs/operations.md#alerts.
"""


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {"groups": rules["groups"]},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, as in the source."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(source: Path = RULES) -> str:
    rules = yaml.safe_load(source.read_text())
    document = prometheus_rule(rules)
    return _HEADER + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000)
