"""The recording rules and alerts (deploy/monitoring/rules.yaml), checked and unit-tested
by the real promtool (Debian's ``prometheus`` package, installed with apt-get when
missing), and the Prometheus Operator objects generated from them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import tools
from devstack import monitoring

REPO = monitoring.REPO
TESTS = REPO / "tests" / "monitoring" / "rules_test.yaml"
KUBE_MONITORING = REPO / "deploy" / "kubernetes" / "monitoring"
OPERATIONS = REPO / "docs" / "operations.md"
JOB = "ext-proc-token-policy"


def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(monitoring.RULES.read_text())
    return loaded


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rules()["groups"] for rule in group["rules"] if "alert" in rule]


def run(promtool: str, *args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_promtool_checks_the_rules_file_and_the_prometheus_rule(promtool, tmp_path):
    done = run(promtool, "check", "rules", monitoring.RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    spec = yaml.safe_load(monitoring.PROMETHEUS_RULE.read_text())["spec"]
    extracted = tmp_path / "from-prometheusrule.yaml"
    extracted.write_text(yaml.safe_dump(spec))
    done = run(promtool, "check", "rules", extracted)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_promtool_unit_tests_pass(promtool):
    done = run(promtool, "test", "rules", TESTS.name, cwd=TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_stays_silent():
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - fires == set(), "alerts without a firing case"
    assert names - silent == set(), "alerts without a silent case"
    assert len(names) >= 10


@pytest.mark.parametrize(
    ("replacement", "cases"),
    [("vector(0) > 1", "firing"), ("vector(1)", "silent")],
)
def test_the_unit_tests_fail_when_an_alert_never_fires_or_always_fires(
    promtool, tmp_path, replacement, cases
):
    """The cases are not vacuous: every alert's expression replaced, promtool fails, and
    names every alert."""
    changed = rules()
    for group in changed["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["expr"] = replacement
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(changed))
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = ["rules.yaml"]
    (tmp_path / "rules_test.yaml").write_text(yaml.safe_dump(tests))
    done = run(promtool, "test", "rules", "rules_test.yaml", cwd=tmp_path)
    assert done.returncode != 0, f"{cases} cases passed with every alert {replacement!r}"
    for rule in alerts():
        assert f"alertname: {rule['alert']}," in done.stdout + done.stderr, rule["alert"]


def test_every_alert_has_a_severity_and_a_runbook_in_operations():
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in alerts():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/operations.md", rule["alert"]
        assert anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, rule["alert"]


def test_every_rule_selects_the_job_the_pod_monitor_gives():
    for group in rules()["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            if "ext_proc_" in expr or "up{" in expr:
                assert f'job="{JOB}"' in expr or expr.startswith("ext_proc:"), rule


def test_the_pod_monitor_scrapes_the_deployments_metrics_port_as_the_rules_job():
    monitor = yaml.safe_load((KUBE_MONITORING / "podmonitor.yaml").read_text())
    deployment = yaml.safe_load((REPO / "deploy" / "kubernetes" / "deployment.yaml").read_text())
    config = yaml.safe_load((REPO / "deploy" / "kubernetes" / "configmap.yaml").read_text())
    pod = deployment["spec"]["template"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = yaml.safe_load(config["data"]["config.yaml"])["metrics_listen"]
    assert listen == f"0.0.0.0:{ports[endpoint['port']]}"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert {"action": "replace", "targetLabel": "job", "replacement": JOB} in endpoint[
        "relabelings"
    ]


@pytest.mark.skipif(tools.which("kubectl") is None, reason="kubectl is not on PATH")
def test_the_monitoring_kustomization_renders_both_objects():
    kubectl = tools.which("kubectl")
    assert kubectl is not None
    done = subprocess.run(
        [kubectl, "kustomize", str(KUBE_MONITORING)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rendered = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert sorted(doc["kind"] for doc in rendered) == ["PodMonitor", "PrometheusRule"]
    for doc in rendered:
        assert doc["metadata"]["namespace"] == "llm-d"
