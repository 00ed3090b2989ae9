"""Generate a fail-closed Envoy bootstrap from a short YAML description.

``python -m ext_proc envoy-config INPUT.yaml [-o OUT]`` reads a few lines::

    listener_port: 8080
    processor: ext-proc-token-policy-headless.llm-d.svc.cluster.local:50051
    body_mode: buffered              # buffered | streamed
    upstreams:
      aggregated: vllm.llm-d.svc.cluster.local:8000
      disaggregated: vllm-decode.llm-d.svc.cluster.local:8000
    routes:
    - prefix: /pd/v1/
      prefix_rewrite: /v1/
      upstream: disaggregated
      policy: {topology: disaggregated, action: honor, max_ids: 131072}
    - prefix: /
      upstream: aggregated
      policy: {topology: aggregated, action: strip}

and writes a whole Envoy bootstrap like ``envoy/envoy.yaml``: the ext_proc filter with
``failure_mode_allow: false`` and every CEL attribute the processor reads
(``attributes.attribute_keys``), vLLM-shaped local replies, route policy metadata,
raised per-route body buffers, an HTTP/2 processor cluster with wide windows and gRPC
health checks, and a JSON access log. Options: one gRPC message per request
(``one_message``), the processor over a Unix socket (``processor: unix:/path``) or TLS
(``processor_tls``, mutual with a client certificate), a gzip decompressor before
ext_proc (``decompress_gzip``); ``description`` becomes the header comment.

``inputs`` validates the description, ``output`` builds the typed Envoy messages and the
YAML, ``cli`` is the command. Every ``envoy/*.yaml`` is generated from
``envoy/inputs/`` (``make envoy-configs``).
"""

from ext_proc.envoygen.cli import generate, main
from ext_proc.envoygen.inputs import (
    PROCESSOR_CLUSTER,
    GeneratorError,
    GeneratorInput,
    PolicyInput,
    load_input,
    read_input,
)
from ext_proc.envoygen.output import (
    DECOMPRESSOR_FILTER,
    EXT_PROC_FILTER,
    HTTP_OPTIONS,
    PROCESSOR_SERVICE,
    ROUTER_FILTER,
    TLS_SOCKET,
    build,
    render,
    to_dict,
)

__all__ = [
    "DECOMPRESSOR_FILTER",
    "EXT_PROC_FILTER",
    "HTTP_OPTIONS",
    "PROCESSOR_CLUSTER",
    "PROCESSOR_SERVICE",
    "ROUTER_FILTER",
    "TLS_SOCKET",
    "GeneratorError",
    "GeneratorInput",
    "PolicyInput",
    "build",
    "generate",
    "load_input",
    "main",
    "read_input",
    "render",
    "to_dict",
]
