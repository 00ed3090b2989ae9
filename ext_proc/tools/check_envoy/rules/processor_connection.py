"""The processor's cluster bounds what one HTTP/2 connection to it holds.

Envoy ends a connection whose frames not yet written pass ``max_outbound_frames``
(10,000 unless set) as a flood, resetting every stream on it. A buffered body goes to the
processor in 16 KiB DATA frames, over a thousand for 16 MiB: without
``max_concurrent_streams`` (Envoy's default is 2^31 - 1) every request shares one
connection, and a processor slow to read lets enough bodies queue there to end it, each
of its requests failed. Bounding the streams and giving their bodies' frames room is
what ``envoy-config`` writes (``envoygen.processor_outbound_frames``); without either the
check warns, since the processor's replies stay sound and only availability suffers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ext_proc.tools.check_envoy.findings import Finding, warning
from ext_proc.tools.check_envoy.reader import Clusters

_BOUNDS = ("max_concurrent_streams", "max_outbound_frames")


def processor_connection(
    place: str,
    entry: dict[str, Any],
    options: Mapping[str, dict[str, Any]],
    known: Clusters | None,
) -> Iterator[Finding]:
    """``entry``: this processor's ext_proc filter; ``options``: each cluster's
    ``HttpProtocolOptions`` (``reader.http_options``); ``known``: the bootstrap's clusters
    (one not listed there is not seen here)."""
    target = entry["typed_config"].get("grpc_service", {}).get("envoy_grpc")
    if known is None or not isinstance(target, dict):
        return
    name = target.get("cluster_name")
    if name not in known.static:
        return
    explicit = options.get(str(name), {}).get("explicit_http_config", {})
    h2 = explicit.get("http2_protocol_options", {}) if isinstance(explicit, dict) else {}
    missing = [key for key in _BOUNDS if not (isinstance(h2, dict) and h2.get(key))]
    if missing:
        yield warning(
            "processor-connection-unbounded",
            f"{place} cluster {name}",
            f"the processor's cluster sets no http2_protocol_options {' or '.join(missing)}: "
            "bodies queued on one connection to a processor slow to read can end it as an "
            "outbound flood, every request on it failed; set both as envoy-config writes "
            "them (at most 8 streams, their largest bodies' 16 KiB frames on top of 10,000)",
        )
