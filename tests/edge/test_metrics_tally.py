"""The decision counter and the two histograms counted as plain numbers in the process
(``Metrics(tally=True)``, the default outside multiprocess mode) expose what
prometheus_client's own metrics expose for the same calls: names, types, help, labels,
series and values, in the same order; only the creation times differ."""

import random

import pytest
from prometheus_client import values

from ext_proc.core.decisions import REASONS_BY_ACTION
from ext_proc.core.reasons import Reason
from ext_proc.edge.metrics import BODY_BUCKETS, TIME_BUCKETS, Metrics

CREATED = "_created"


def exposed(
    metrics: Metrics,
) -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
    """Every family the registry exposes, its samples in order; a creation time is
    only said to be there."""
    return [
        (
            family.name,
            family.type,
            family.documentation,
            [
                (s.name, s.labels, 0.0 if s.name.endswith(CREATED) else s.value)
                for s in family.samples
            ],
        )
        for family in sorted(metrics.registry.collect(), key=lambda family: family.name)
    ]


def both() -> tuple[Metrics, Metrics]:
    return Metrics(tally=True), Metrics(tally=False)


SIZES = [0, 1, 1023, 1024, 1025, *(int(b) for b in BODY_BUCKETS), 64 << 20, (64 << 20) + 1]
SECONDS = [0.0, 0.00001, *TIME_BUCKETS, 4.9999, 5.0000001, 60.0]


def test_the_tally_exposes_what_the_prometheus_metrics_do():
    tallied, children = both()
    assert exposed(tallied) == exposed(children)  # before any outcome
    for metrics in (tallied, children):
        for size in SIZES:
            metrics.decided("r", "deny", Reason.IDS_MALFORMED, "enforce", size)
        metrics.decided("r", "allow", "no_params", "audit", 10)
        metrics.decided("s", "strip", Reason.STRIPPED_BY_POLICY, "enforce", 0)  # no size observed
        for seconds in SECONDS:
            metrics.observe_processing("r", seconds)
        metrics.observe_processing("t", 0.001)  # a route that decided nothing
    assert exposed(tallied) == exposed(children)


def test_random_outcomes_are_exposed_alike():
    rng = random.Random(59)
    pairs = [(a, r) for a, reasons in REASONS_BY_ACTION.items() for r in reasons]
    tallied, children = both()
    for _ in range(2000):
        route = rng.choice(["a", "b", "c"])
        action, reason = rng.choice(pairs)
        mode = rng.choice(["enforce", "audit"])
        size = rng.choice([0, rng.randrange(1 << 27), rng.choice(SIZES)])
        seconds = rng.choice([rng.random() * 6, rng.choice(SECONDS)])
        for metrics in (tallied, children):
            metrics.decided(route, action, reason, mode, size)
            metrics.observe_processing(route, seconds)
    assert exposed(tallied) == exposed(children)


def test_a_creation_time_is_the_series_first_count():
    tallied = Metrics(tally=True)
    tallied.decided("r", "deny", Reason.IDS_MALFORMED, "enforce", 10)
    created = [
        s.value
        for family in tallied.registry.collect()
        for s in family.samples
        if s.name.endswith(CREATED)
    ]
    assert created
    assert all(value > 1.6e9 for value in created)


@pytest.mark.skipif(values.ValueClass is not values.MutexValue, reason="multiprocess mode")
def test_outside_multiprocess_mode_outcomes_are_tallied():
    assert Metrics().tallied
