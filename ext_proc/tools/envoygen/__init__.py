"""Generate a fail-closed Envoy bootstrap from a short YAML description.

``python -m ext_proc envoy-config INPUT.yaml [-o OUT]`` reads a few lines::

    listener_port: 8080
    processor: ext-proc-token-policy-headless.llm-d.svc.cluster.local:50051
    body_mode: buffered              # buffered | streamed
    upstreams:
      aggregated: vllm.llm-d.svc.cluster.local:8000
      disaggregated: vllm-decode.llm-d.svc.cluster.local:8000
      prefill: vllm-prefill.llm-d.svc.cluster.local:8000
    routes:
    - prefix: /pd/prefill/v1/
      prefix_rewrite: /v1/
      upstream: prefill
      policy: {topology: disaggregated, action: mint, max_ids: 131072}
    - prefix: /pd/v1/
      prefix_rewrite: /v1/
      upstream: disaggregated
      policy: {topology: disaggregated, action: honor, vocab_size: 262144, max_ids: 131072}
    - prefix: /
      upstream: aggregated
      policy: {topology: aggregated, action: strip}

and writes a whole Envoy bootstrap like ``envoy/envoy.yaml``: the ext_proc filter with
``failure_mode_allow: false`` and every CEL attribute the processor reads
(``attributes.attribute_keys``), vLLM-shaped local replies, route policy metadata,
raised per-route body buffers, an HTTP/2 processor cluster with wide windows and gRPC
health checks, a JSON access log, and Envoy's edge limits against hostile load (an
overload manager capping downstream connections, ``max_downstream_connections``, and
the heap, ``max_heap_size_bytes``; 32 KiB connection buffers; downstream HTTP/2 stream
and window limits; a request headers timeout). Options: one gRPC message per request
(``one_message``), the processor over a Unix socket (``processor: unix:/path``) or TLS
(``processor_tls``, mutual with a client certificate), one endpoint per worker of
``serve --workers N`` (``processor_workers``: worker i at the processor's port plus i),
a gzip decompressor before ext_proc (``decompress_gzip``), the gateway listener over
mutual TLS for routes that trust listed peers (``listener_tls``); ``description``
becomes the header comment.

A route whose policy action is ``mint`` (the prefill leg) gets an ``ExtProcPerRoute``
override that also sends the response headers and the buffered response body to the
processor. A route that matches request ``headers`` makes every request that sends
one of them twice, or as a list, a 400 before the processor (``route_headers``). A
route with a ``prefix_rewrite`` carries it in its policy metadata too
(``match_prefix``, ``prefix_rewrite``: ``rewrite_fields``), so the processor knows the
path the upstream receives. vLLM's token-in and echo endpoints (``/inference/``, any
path whose last segment is ``render`` or ``derender``), as each route's upstream would
see them after its rewrite, are answered 404 before every route
(``ext_proc.tools.token_endpoints``).

``inputs`` validates the description, ``output`` builds the typed Envoy messages and the
YAML, ``cli`` is the command. Every ``envoy/*.yaml`` is generated from
``envoy/inputs/`` (``make envoy-configs``).
"""

from ext_proc.tools.envoy_names import BUFFER_FILTER, PER_ROUTE_TYPE
from ext_proc.tools.envoygen.cli import generate, main
from ext_proc.tools.envoygen.inputs import (
    MINT_BUFFER_MIN,
    PROCESSOR_CLUSTER,
    RESERVED_ROUTE_PREFIX,
    REWRITE_FIELDS,
    GeneratorError,
    GeneratorInput,
    PolicyInput,
    load_input,
    read_input,
    rewrite_fields,
    state_rewrite,
)
from ext_proc.tools.envoygen.output import (
    DECOMPRESSOR_FILTER,
    ENVOY_DATA_FRAME_BYTES,
    ENVOY_OUTBOUND_FRAMES,
    EXT_PROC_FILTER,
    HTTP_OPTIONS,
    MESSAGE_OVERHEAD_BYTES,
    PROCESSOR_SERVICE,
    PROCESSOR_STREAMS,
    RATE_LIMIT_FILTER,
    ROUTER_FILTER,
    TLS_SOCKET,
    build,
    processor_outbound_frames,
    processor_workers_fields,
    render,
    to_dict,
)

__all__ = [
    "BUFFER_FILTER",
    "DECOMPRESSOR_FILTER",
    "ENVOY_DATA_FRAME_BYTES",
    "ENVOY_OUTBOUND_FRAMES",
    "EXT_PROC_FILTER",
    "HTTP_OPTIONS",
    "MESSAGE_OVERHEAD_BYTES",
    "MINT_BUFFER_MIN",
    "PER_ROUTE_TYPE",
    "PROCESSOR_CLUSTER",
    "PROCESSOR_SERVICE",
    "PROCESSOR_STREAMS",
    "RATE_LIMIT_FILTER",
    "RESERVED_ROUTE_PREFIX",
    "REWRITE_FIELDS",
    "ROUTER_FILTER",
    "TLS_SOCKET",
    "GeneratorError",
    "GeneratorInput",
    "PolicyInput",
    "build",
    "generate",
    "load_input",
    "main",
    "processor_outbound_frames",
    "processor_workers_fields",
    "read_input",
    "render",
    "rewrite_fields",
    "state_rewrite",
    "to_dict",
]
