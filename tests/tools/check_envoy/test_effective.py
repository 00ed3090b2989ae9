"""A filter's setting on a route: the most specific typed_per_filter_config that says
something wins (weighted cluster, route, virtual host, route configuration)."""

import pytest

from ext_proc.tools.check_envoy.effective import (
    effective,
    ext_proc_mode,
    ext_proc_runs,
    hold_settings,
    runs,
)
from ext_proc.tools.check_envoy.reader import Hold
from tests.tools.check_envoy.shipped import (
    BUFFER,
    BUFFER_PER_ROUTE,
    EXT_PROC,
    FILTER_CONFIG,
    PER_ROUTE,
)

OFF = {"@type": PER_ROUTE, "disabled": True}
ON = {"@type": PER_ROUTE}
SKIP = {"request_header_mode": "SKIP", "request_body_mode": "BUFFERED"}
SEND = {"request_header_mode": "SEND", "request_body_mode": "BUFFERED"}
MODE = {"@type": PER_ROUTE, "overrides": {"processing_mode": SEND}}


def levels(*configs):
    return [{EXT_PROC: c} if c is not None else {} for c in configs]


def test_the_first_level_that_decides_wins_else_the_default():
    says = {"a": None, "b": 2, "c": 3}.get
    assert effective([{"f": "a"}, {"f": "b"}, {"f": "c"}], "f", says, 0) == 2
    assert effective([{"g": "b"}, "not a mapping", {"f": "a"}], "f", says, 0) == 0


@pytest.mark.parametrize(
    ("configs", "by_default", "runs"),
    [
        ((None, None, None), True, True),
        ((None, None, None), False, False),
        ((OFF, None, None), True, False),
        ((None, OFF, None), True, False),
        # The route's word over its virtual host's, and a weighted cluster's over both.
        ((ON, OFF, None), True, True),
        ((OFF, ON, ON), False, False),
        # Any configuration enables a filter disabled by default; a FilterConfig too.
        ((None, None, ON), False, True),
        (({"@type": FILTER_CONFIG}, None, None), False, True),
        (({"@type": FILTER_CONFIG, "disabled": True}, ON, None), True, False),
        # Another type under the filter's name says nothing.
        (({"@type": "type.googleapis.com/x"}, OFF, None), True, False),
        # A wrapper that only enables the filter configures nothing of ext_proc's: a
        # disabled ext_proc configuration below it stays in force (Envoy's merge).
        (({"@type": FILTER_CONFIG, "config": {}}, OFF, None), True, False),
        (({"@type": FILTER_CONFIG, "config": {}}, OFF, None), False, False),
        (({"@type": FILTER_CONFIG, "config": {}}, None, ON), False, True),
        (({"@type": FILTER_CONFIG, "config": ON}, OFF, None), True, True),
    ],
)
def test_whether_the_filter_runs(configs, by_default, runs):
    assert ext_proc_runs(EXT_PROC, by_default, levels(*configs)) is runs


GUARD = "tenant-guard"
GUARD_PER_ROUTE = {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3."
    "HeaderMutationPerRoute"
}
WRAPPED_OFF = {"@type": FILTER_CONFIG, "disabled": True}


@pytest.mark.parametrize(
    ("configs", "disabled", "expected"),
    [
        ((None, None, None), False, True),
        ((None, None, None), True, False),
        ((WRAPPED_OFF, None, None), False, False),
        ((None, None, WRAPPED_OFF), False, False),
        ((GUARD_PER_ROUTE, WRAPPED_OFF, None), False, True),
        # Any filter's own route-level configuration enables it where it is disabled.
        ((None, GUARD_PER_ROUTE, None), True, True),
        (({"@type": FILTER_CONFIG}, None, None), True, True),
    ],
)
def test_whether_any_filter_runs(configs, disabled, expected):
    entry = {"name": GUARD, "disabled": disabled}
    given = [{GUARD: c} if c is not None else {} for c in configs]
    assert runs(entry, given) is expected


@pytest.mark.parametrize(
    ("configs", "mode"),
    [
        ((None, None), SKIP),
        ((MODE, None), SEND),
        ((None, MODE), SEND),
        # A level without a processing mode leaves it to the levels around it.
        ((ON, MODE), SEND),
        ((OFF, MODE), None),
        ((MODE, OFF), SEND),
        # A disabled level below the one that enables the filter ends the search: the
        # filter's own mode applies, not one stated further down (Envoy's merge).
        ((ON, OFF), SKIP),
        ((ON, OFF, MODE), SKIP),
        ((ON, None, MODE), SEND),
        (({"@type": FILTER_CONFIG, "config": MODE}, None), SEND),
    ],
)
def test_the_processing_mode(configs, mode):
    assert ext_proc_mode(EXT_PROC, SKIP, levels(*configs)) == mode


HOLD = Hold(BUFFER, 3, {"max_request_bytes": 16}, off_by_default=False)


@pytest.mark.parametrize(
    ("hold", "configs", "settings"),
    [
        (HOLD, (), {"max_request_bytes": 16}),
        (Hold(BUFFER, 3, {}, off_by_default=True), (), None),
        (HOLD, ({"@type": BUFFER_PER_ROUTE, "disabled": True},), None),
        (HOLD, ({"@type": FILTER_CONFIG, "disabled": True},), None),
        (
            HOLD,
            ({"@type": BUFFER_PER_ROUTE, "buffer": {"max_request_bytes": 8}},),
            {"max_request_bytes": 8},
        ),
        # An empty wrapper enables the filter as configured, whatever is around it.
        (
            Hold(BUFFER, 3, {"max_request_bytes": 4}, off_by_default=True),
            ({"@type": FILTER_CONFIG}, {"@type": BUFFER_PER_ROUTE, "disabled": True}),
            {"max_request_bytes": 4},
        ),
        # A BufferPerRoute with neither leaves it to the levels around it.
        (
            HOLD,
            ({"@type": BUFFER_PER_ROUTE}, {"@type": BUFFER_PER_ROUTE, "disabled": True}),
            None,
        ),
    ],
)
def test_the_buffer_filters_settings(hold, configs, settings):
    assert hold_settings(hold, [{BUFFER: c} for c in configs]) == settings
