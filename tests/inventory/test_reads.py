"""reads: the request headers a server reads (and not the ones it writes or sends), the
content-part types its renderer maps, compares or validates, and the kv_transfer_params
keys its connectors and its own code read (and not the ones they write)."""

from __future__ import annotations

from pathlib import Path

from devstack.inventory import reads
from devstack.inventory.schema import Schema
from tests.inventory.wheelfiles import package

SERVER = {
    "app/serving.py": """
        from fastapi import Header, Request
        from starlette.datastructures import Headers
        from app.names import SESSION_HEADER

        async def handle(raw_request: Request, response, x_trace_id: str = Header(None)):
            raw_request.headers.get("X-Request-Id")
            raw_request.headers[SESSION_HEADER]
            if "X-Data-Parallel-Rank" in raw_request.headers:
                pass
            Headers(scope={}).get(b"x-body-compressed")
            response.headers.get("x-response-only")
            raw_request.headers["x-written"] = "1"

        async def aliased(key: str | None = Header(default=None, alias="X-Api-Key")): ...
    """,
    "app/names.py": 'SESSION_HEADER = "X-Session-ID"\n',
    "app/overrides.py": """
        _HEADER_OVERRIDES = {"x-override-rid": "rid", "x-override-room": "room"}

        def apply(headers) -> None:
            for header in _HEADER_OVERRIDES:
                headers.get(header)
    """,
    "app/client.py": """
        INTEGRATION_HEADER = "x-client-integration"

        def send(session, headers) -> None:
            headers.get("Accept")  # this module reads a constant only
    """,
    "app/tracing.py": """
        TRACE_HEADERS = ["traceparent", "tracestate"]

        def extract(headers):
            return {h: headers[h] for h in TRACE_HEADERS if h in headers}
    """,
}


def test_headers_read_by_the_server(tmp_path: Path) -> None:
    assert reads.headers(package(tmp_path, SERVER), ("app",)) == {
        "x-request-id",
        "x-session-id",
        "x-data-parallel-rank",
        "x-body-compressed",
        "x-trace-id",  # a Header() parameter: its name, hyphenated
        "x-api-key",
        "x-override-rid",
        "x-override-room",
        "accept",
        "traceparent",
        "tracestate",
    }


RENDERER = {
    "app/chat_utils/__init__.py": "",
    "app/chat_utils/parts.py": """
        MM_PARSER_MAP = {"text": str, "image_url": str, "prompt_embeds": str}

        def parse(part):
            part_type = part.get("type")
            if part_type == "thinking":
                pass
            elif part_type in ("input_audio", "video_url"):
                pass
            elif part.get("kind") == "not-a-part-type":
                pass
    """,
    "app/protocol.py": """
        from typing import Annotated, Literal, Union
        from pydantic import AfterValidator, BaseModel

        class Text(BaseModel):
            type: Literal["text"]

        class Thinking(BaseModel):
            type: Literal["thinking", "reasoning"]

        class Audio(BaseModel):
            type: Literal["audio_url"]

        AudioPart = Annotated[Union[Audio], AfterValidator(lambda x: x)]
        ContentPart = Union[Text, Thinking, AudioPart]
        Other = Literal["not-a-part-type"]
    """,
}


def test_part_types_mapped_and_compared(tmp_path: Path) -> None:
    wheel = package(tmp_path, RENDERER)
    assert reads.part_types(wheel, Schema(wheel), ("app.chat_utils",), ()) == {
        "text",
        "image_url",
        "prompt_embeds",
        "thinking",
        "input_audio",
        "video_url",
    }


def test_part_types_a_union_of_part_models_validates(tmp_path: Path) -> None:
    wheel = package(tmp_path, RENDERER)
    found = reads.part_types(wheel, Schema(wheel), (), ("app.protocol.ContentPart",))
    assert found == {"text", "thinking", "reasoning", "audio_url"}


ENGINE = {
    "app/kv_transfer/nixl.py": """
        KEY = "remote_port"

        def start(request, params, sampling_params):
            params.get("do_remote_prefill")
            request.kv_transfer_params["remote_host"]
            if "remote_engine_id" in params:
                pass
            params[KEY]
            params["written"] = 1
            spec = params["disagg_spec"]
            spec["nested_member"]
            sampling_params.extra_args.get("not_params")
    """,
    "app/renderer.py": """
        def reused(request, params):
            kv = getattr(request, "kv_transfer_params", None)
            kv.pop("prompt_token_ids", None)
            other = request.kv_transfer_params or {}
            other.get("remote_prefill_cached_tokens")
            params.get("ignored_outside_the_connectors")
    """,
}


def test_connector_keys_read_from_the_parameters(tmp_path: Path) -> None:
    found = reads.connector_keys(package(tmp_path, ENGINE), ("app.kv_transfer",), "app")
    assert found == {
        "do_remote_prefill",
        "remote_host",
        "remote_engine_id",
        "remote_port",
        "disagg_spec",
        "prompt_token_ids",
        "remote_prefill_cached_tokens",
    }
