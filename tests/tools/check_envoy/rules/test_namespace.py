"""A route's metadata under a name one slip from the processor's namespace is an error:
the processor reads only its own namespace, so the route would run with no policy (a
mint route signing nothing) or without the fields the operator meant."""

import pytest

from ext_proc.tools.check_envoy.rules.namespace import distance, near
from tests.tools.check_envoy.shipped import at, found, mutated, route

NAMESPACE = "ext_proc.token_policy"


def _renamed(name: str, to: str, keep: bool = False):
    def change(config):
        metadata = route(config, name)["metadata"]["filter_metadata"]
        policy = metadata[NAMESPACE] if keep else metadata.pop(NAMESPACE)
        metadata[to] = dict(policy)

    return change


@pytest.mark.parametrize(
    "slip",
    [
        "ext_proc.token_polcy",  # a letter dropped
        "ext_proc.token_poliyc",  # two swapped
        "ext_proc.tokens_policy",  # one typed
        "ext_proc.token-policy",  # a separator replaced
        "ext-proc.token-policy",  # two
        "Ext_Proc.Token_Policy",  # case
        "ext_proc_token_policy",
        "extproc.tokenpolicy",  # separators dropped
    ],
)
@pytest.mark.parametrize("name", ["prefill", "disaggregated"])
def test_a_namespace_one_slip_away_is_an_error(slip, name):
    report = mutated(_renamed(name, slip))
    assert found(report) == [("policy-namespace-misspelt", at(name))]
    (text,) = report.errors
    assert repr(slip) in text
    assert "no policy (aggregated + strip)" in text
    assert found(report, "warning") == [("policy-missing", at(name))]


def test_a_slip_beside_the_namespace_is_an_error_too():
    # The fields the operator meant to change sit where the processor never reads them.
    report = mutated(_renamed("prefill", "ext_proc.token_polciy", keep=True))
    assert found(report) == [("policy-namespace-misspelt", at("prefill"))]
    (text,) = report.errors
    assert "runs with its policy" in text
    assert found(report, "warning") == []


@pytest.mark.parametrize("other", ["istio", "envoy.lb", "ext_proc.turns", "my.ns"])
def test_another_namespace_is_none_of_its_business(other):
    assert mutated(_renamed("prefill", other, keep=True)).findings == ()


def test_a_short_namespace_is_compared_by_case_and_separators_only():
    assert near("M.Y", "my")
    assert not near("mx", "my")
    assert near("ext_proc.token_polic", NAMESPACE)
    assert not near("ext_proc.tok_polic", NAMESPACE)


@pytest.mark.parametrize(
    ("a", "b", "edits"),
    [
        ("", "", 0),
        ("abc", "abc", 0),
        ("abc", "acb", 1),
        ("abc", "ab", 1),
        ("ab", "ba", 1),
        ("kitten", "sitting", 3),
        ("abcd", "badc", 2),
        ("", "ab", 2),
    ],
)
def test_distance_counts_typed_dropped_replaced_and_swapped(a, b, edits):
    assert distance(a, b) == edits == distance(b, a)
