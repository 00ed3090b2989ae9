"""Findings are values with a documented code."""

import re
from pathlib import Path

import pytest

from ext_proc.tools.check_envoy.findings import CODES, Finding, Report, error, warning

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def test_a_finding_has_a_listed_code():
    with pytest.raises(ValueError, match="not in CODES"):
        error("no-such-code", "here", "what")


def test_codes_are_plain_stable_strings():
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", code) for code in CODES)


def test_every_code_is_documented():
    # docs/operations.md lists every code, with what it means.
    text = OPERATIONS.read_text()
    assert [code for code in CODES if f"`{code}`" not in text] == []


def test_a_report_lists_texts_by_severity_in_order():
    report = Report(
        (
            error("hold-missing", "a", "one"),
            warning("policy-missing", "b", "two"),
            error("listener-missing", "", "three"),
        ),
        routes=1,
    )
    assert report.errors == ["a: one", "three"]
    assert report.warnings == ["b: two"]
    assert report.codes() == ["hold-missing", "policy-missing", "listener-missing"]
    assert report.codes("warning") == ["policy-missing"]


def test_a_finding_is_frozen():
    finding = Finding("hold-missing", "a", "error", "one")
    with pytest.raises(AttributeError):
        finding.code = "x"  # type: ignore[misc]
