"""Every reason is a member of one enumeration (ext_proc/core/reasons.py): the package
spells none anywhere else, docs/trust.md's tables name each exactly once, the
monitoring files name only members, and each member is reported under some action."""

import ast
import re
from pathlib import Path

import pytest

from ext_proc.core import caller, mint, reasons
from ext_proc.core.decisions import REASONS_BY_ACTION
from ext_proc.core.events import NO_PEER, Peer
from ext_proc.core.reasons import Reason
from ext_proc.core.replay import Verdict
from ext_proc.core.route_policy import Action, IdentityType, RoutePolicy, Topology

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ext_proc"
VALUES = {reason.value for reason in Reason}
# Strings equal to a member's value that name something else: the route metadata field


def literals(path: Path) -> set[str]:
    """The string constants of a module that equal a reason's value."""
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in VALUES
    }


def test_no_module_but_reasons_spells_a_reason():
    found = {
        (str(path.relative_to(PACKAGE)), value)
        for path in PACKAGE.rglob("*.py")
        if "_pb" not in path.parts and path.name != "reasons.py"
        for value in literals(path)
    }
    assert found == set()


def test_the_scan_sees_a_spelled_reason(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('x = Allow("trusted_peer")\ny = f"no_body"\nz = f"token_policy_{x}"\n')
    assert literals(module) == {"trusted_peer", "no_body"}


def reason_tables(text: str) -> list[str]:
    """Every reason named in the first column of a table whose first header is
    ``reason``, in order (a cell may name several)."""
    named: list[str] = []
    in_table = False
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            in_table = False
        elif cells[0] == "reason":
            in_table = True
        elif in_table and not set(cells[0]) <= {"-", ":"}:
            named += re.findall(r"`([^`]+)`", cells[0])
    return named


def test_docs_trust_names_every_reason_once_and_nothing_else():
    named = reason_tables((REPO / "docs" / "trust.md").read_text())
    assert sorted(named) == sorted(VALUES)


def test_the_docs_check_sees_a_missing_or_unknown_reason():
    table = "| reason | when |\n|---|---|\n| `minted`, `no_body` | x |\n| `made_up` | y |\n"
    assert reason_tables(table + "\nprose `no_body`\n") == ["minted", "no_body", "made_up"]


MONITORING = (
    "deploy/monitoring/rules.yaml",
    "deploy/monitoring/dashboard.json",
    "deploy/kubernetes/monitoring/prometheusrule.yaml",
)


def monitored_reasons(text: str) -> set[str]:
    """Every reason a PromQL matcher in ``text`` names (JSON escapes its quotes)."""
    found: set[str] = set()
    for match in re.finditer(r'reason=~?\\?"([^"\\]*)\\?"', text):
        found.update(match.group(1).split("|"))
    return found


@pytest.mark.parametrize("name", MONITORING)
def test_the_monitoring_files_match_only_reasons(name):
    found = monitored_reasons((REPO / name).read_text())
    assert {"inflight_budget_exhausted", "proof_expired"} <= found
    assert found <= VALUES


def test_the_monitoring_check_sees_every_matcher():
    text = 'x{reason="a"} y{reason=~\\"b|c\\"}'
    assert monitored_reasons(text) == {"a", "b", "c"}


def test_every_reason_is_reported_under_some_action():
    assert set().union(*REASONS_BY_ACTION.values()) == set(Reason)
    assert set(REASONS_BY_ACTION) == {"allow", "strip", "honor", "deny", "mint"}


def test_the_groups_are_disjoint_and_trust_is_only_its_own():
    groups = [reasons.TRUSTED, reasons.UNTRUSTED, reasons.REFUSED, reasons.UNSIGNED]
    assert sum(map(len, groups)) == len(frozenset().union(*groups))
    # A reason named for trust is one that trusts.
    assert {r for r in Reason if r.value.partition("_")[0] == "trusted"} == reasons.TRUSTED


def test_a_record_verdict_is_a_reason_to_leave_a_proof_unproven():
    assert Verdict.FIRST.reason is None
    for verdict in set(Verdict) - {Verdict.FIRST}:
        assert verdict.reason in reasons.UNTRUSTED
        assert verdict.value == verdict.reason.value


@pytest.mark.parametrize("refused", list(Reason))
def test_a_response_whose_headers_a_request_would_be_refused_for_is_unsigned(refused):
    expected = {Reason.CONTENT_ENCODING: Reason.RESPONSE_ENCODED}
    unsigned = mint.unreadable(refused)
    assert unsigned == expected.get(refused, Reason.RESPONSE_NOT_JSON)
    assert unsigned in reasons.UNSIGNED


ROUTER = (IdentityType.URI, "spiffe://td/router")


@pytest.mark.parametrize(
    ("route", "peer", "expected"),
    [
        (RoutePolicy(Topology.AGGREGATED, Action.STRIP), NO_PEER, Reason.STRIPPED_BY_POLICY),
        (RoutePolicy(Topology.AGGREGATED, Action.DENY), NO_PEER, Reason.DENIED_BY_POLICY),
        (
            RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, trust_any_caller=True),
            NO_PEER,
            Reason.TRUSTED_ANY_CALLER,
        ),
        (RoutePolicy(Topology.DISAGGREGATED, Action.HONOR), NO_PEER, Reason.UNPROVEN),
        (RoutePolicy(Topology.DISAGGREGATED, Action.MINT), NO_PEER, Reason.UNPROVEN),
        (
            RoutePolicy(Topology.DISAGGREGATED, Action.MINT, peers=frozenset({ROUTER})),
            Peer(True, (ROUTER,)),
            Reason.TRUSTED_PEER,
        ),
        (
            RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, peers=frozenset({ROUTER})),
            Peer(False, (ROUTER,)),
            Reason.PEER_NOT_LISTED,
        ),
    ],
)
def test_the_caller_is_trusted_for_a_reason(route, peer, expected):
    who = caller.of(route, peer)
    assert who.reason is expected
    assert who.trusted == (expected in reasons.TRUSTED)
