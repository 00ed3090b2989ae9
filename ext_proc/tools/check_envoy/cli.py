"""``python -m ext_proc check-envoy FILE``: one line per finding, its severity and code
first, then a verdict line; exit 1 when there is an error."""

from __future__ import annotations

import sys
from pathlib import Path

from ext_proc.core.config import Config, ConfigError
from ext_proc.core.route_policy import DEFAULT_NAMESPACE
from ext_proc.tools.check_envoy import envoy_validate, reader
from ext_proc.tools.check_envoy.check import check
from ext_proc.tools.check_envoy.findings import Finding, Report
from ext_proc.tools.check_envoy.rules.processor_tls import Demand, demand


def line(finding: Finding) -> str:
    """``error[ext-proc-not-running]: http_connection_manager[0] route vllm/x: ...``"""
    return f"{finding.severity}[{finding.code}]: {finding.text}"


def main(
    path: Path,
    namespace: str | None = None,
    listeners: frozenset[str] | None = None,
    declared: frozenset[str] = frozenset(),
    envoy: str | None = None,
    *,
    validate: bool = True,
    processor: Path | None = None,
) -> int:
    """``envoy``: the binary that validates the file first (``envoy_validate``).
    ``validate`` False: the caller chose to skip it (``--no-envoy-validate``); True with
    no binary is an error, never an ``OK`` that Envoy did not share."""
    try:
        config = reader.load(path)
    except reader.Unreadable as exc:
        print(exc, file=sys.stderr)
        return 1
    wanted: Demand = "none"
    if processor is not None:
        try:
            wanted = demand(Config.load(processor, environ={}))
        except ConfigError as exc:
            print(f"--processor-config {exc}", file=sys.stderr)
            return 1
    report = check(config, namespace or DEFAULT_NAMESPACE, listeners, declared, wanted)
    validated, said = _validated(path, envoy, validate)
    if validated is not None:
        report = Report((validated, *report.findings), report.routes)
    # Warnings first, then errors: the errors end up next to the verdict.
    for severity in ("warning", "error"):
        for finding in report.findings:
            if finding.severity == severity:
                print(line(finding))
    errors, warnings = len(report.errors), len(report.warnings)
    verdict = "FAILED" if errors else "OK"
    counts = f"{report.routes} routes, {errors} errors, {warnings} warnings"
    print(f"{path}: {verdict} ({counts}; envoy --mode validate {said})")
    return 1 if errors else 0


def _validated(path: Path, envoy: str | None, validate: bool) -> tuple[Finding | None, str]:
    """What ``envoy --mode validate`` found, and how the verdict line says it ran."""
    if not validate:
        return None, "skipped (--no-envoy-validate)"
    if envoy is None:
        return envoy_validate.not_run(), "did not run"
    found = envoy_validate.validate(path, envoy)
    if found is None:
        return None, "passed"
    if found.severity == "error":
        return found, "failed"
    return found, "stopped at a file this machine lacks"
