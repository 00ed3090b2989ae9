"""router_headers: the router's retry and hedge request headers, one list."""

from ext_proc.tools.router_headers import ROUTER_HEADERS


def test_router_headers_are_envoys_lower_case_and_listed_once():
    assert all(name == name.lower() and name.startswith("x-envoy-") for name in ROUTER_HEADERS)
    assert len(set(ROUTER_HEADERS)) == len(ROUTER_HEADERS)


def test_every_header_that_retries_or_hedges_is_listed_and_no_deadline():
    # Spelt out here, from the router's documentation: a third opinion.
    assert set(ROUTER_HEADERS) == {
        "x-envoy-retry-on",
        "x-envoy-retry-grpc-on",
        "x-envoy-max-retries",
        "x-envoy-retriable-status-codes",
        "x-envoy-retriable-header-names",
        "x-envoy-upstream-rq-per-try-timeout-ms",
        "x-envoy-hedge-on-per-try-timeout",
    }
