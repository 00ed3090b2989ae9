"""carrier_headers: the headers the gateway's header step removes, each once, and the
request id it renews rather than removes."""

from ext_proc.tools import carrier_headers
from ext_proc.tools.carrier_headers import (
    CLIENT_REQUEST_ID,
    REQUEST_ID,
    ROUTING_HEADERS,
    removed,
)
from ext_proc.tools.router_headers import ROUTER_HEADERS


def test_routing_headers_are_lower_case_and_listed_once():
    assert all(name == name.lower() for name in ROUTING_HEADERS)
    assert len(set(ROUTING_HEADERS)) == len(ROUTING_HEADERS)
    assert "x-prefiller-host-port" in ROUTING_HEADERS
    assert "x-data-parallel-rank" in ROUTING_HEADERS


def test_an_operators_headers_follow_the_routing_and_router_headers_each_once():
    assert removed() == (*ROUTING_HEADERS, *ROUTER_HEADERS)
    extra = ["x-my-target", "x-prefiller-host-port", "x-envoy-retry-on", "x-my-target"]
    assert removed(extra) == (*ROUTING_HEADERS, *ROUTER_HEADERS, "x-my-target")


def test_the_request_id_headers_are_set_never_listed_for_removal():
    assert removed([REQUEST_ID, CLIENT_REQUEST_ID, "x-other"]) == (
        *ROUTING_HEADERS,
        *ROUTER_HEADERS,
        "x-other",
    )


def test_the_step_is_envoys_header_mutation_filter():
    assert carrier_headers.FILTER == "envoy.filters.http.header_mutation"
    assert carrier_headers.FILTER_TYPE.endswith(".header_mutation.v3.HeaderMutation")
    assert f"%REQ({REQUEST_ID})%" == carrier_headers.INCOMING_ID
