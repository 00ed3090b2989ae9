"""A processor that cannot be reached, fails or does not answer in time is told apart
from a broken request: 503 with ``retry-after`` where nothing was forwarded.

Envoy answers its ext_proc filter's own failures with ``status_on_error`` (500 unless
set), a message timeout with 504, and adds no ``retry-after``. The retry-after comes
from a local reply mapper of the connection manager whose filter is
``envoy_names.RETRY_SAFE``, or, where a scoped wiring sets nothing for the whole
connection manager, from a ``response_headers_to_add`` whose value is
``envoy_names.RETRY_AFTER_FORMAT`` (empty, so not added, for every other answer) on the
route, its virtual host or the route configuration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import Chain, Route
from ext_proc.tools.envoy_names import RETRY_AFTER_FORMAT, RETRY_SAFE, RETRY_STATUS

HEADER: Final = "retry-after"
# Envoy's StatusCode enum accepts its name or its number.
_SERVICE_UNAVAILABLE: Final = (RETRY_STATUS, str(RETRY_STATUS), "ServiceUnavailable")


def error_status(place: str, config: dict[str, Any]) -> Iterator[Finding]:
    """One of this processor's filters: ``status_on_error`` is 503."""
    given = config.get("status_on_error")
    code = given.get("code") if isinstance(given, dict) else None
    if code not in _SERVICE_UNAVAILABLE:
        yield error(
            "processor-error-status",
            place,
            f"status_on_error is {code if given is not None else 'unset (500)'}: a processor "
            "that cannot be reached or fails must answer 503 (status_on_error: {code: 503}) "
            "so a client can tell a request to retry from a broken one",
        )


def _sets_retry_after(options: Any, value: str | None) -> bool:
    """``options`` (a list of HeaderValueOption) sets retry-after, to ``value`` if given,
    and never as an empty header."""
    for option in options if isinstance(options, list) else []:
        header = option.get("header", {}) if isinstance(option, dict) else {}
        if not isinstance(header, dict) or str(header.get("key", "")).lower() != HEADER:
            continue
        if option.get("keep_empty_value", False):
            continue
        if value is None or header.get("value") == value:
            return True
    return False


def mapped(chain: Chain) -> bool:
    """A local reply mapper of the connection manager adds retry-after to a processor
    failure before the router chose an upstream."""
    for mapper in chain.manager.get("local_reply_config", {}).get("mappers", []):
        if not isinstance(mapper, dict):
            continue
        cel = mapper.get("filter", {}).get("extension_filter", {}).get("typed_config", {})
        if cel.get("expression") == RETRY_SAFE and _sets_retry_after(
            mapper.get("headers_to_add"), None
        ):
            return True
    return False


def retry_after(route: Route, vhost: dict[str, Any], chain: Chain) -> Iterator[Finding]:
    """A route this processor polices, where no mapper of the connection manager adds
    retry-after: the route, its virtual host or the route configuration does."""
    top = chain.manager.get("route_config", {})
    levels = (route.entry, vhost, top)
    if any(
        _sets_retry_after(level.get("response_headers_to_add"), RETRY_AFTER_FORMAT)
        for level in levels
    ):
        return
    yield error(
        "retry-after-missing",
        route.place,
        "a processor that cannot be reached or does not answer gets no retry-after here: "
        f"add a local reply mapper whose CEL filter is {RETRY_SAFE!r} with headers_to_add "
        f"retry-after, or response_headers_to_add retry-after {RETRY_AFTER_FORMAT!r} on the "
        "route or its virtual host",
    )
