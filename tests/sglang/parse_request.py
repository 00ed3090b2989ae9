"""What SGLang's own code reads from a request: run with the python of the SGLang
environment (tests/sglang/sglang_env.py), never the project's.

Reads lines on stdin, each a JSON list of cases ``{"model", "body_b64", "headers"}``,
and answers each with one line on stdout (SGLang is imported once, which takes some
seconds): a JSON list with, per case:

* ``members``: every member the body sets, parsed as SGLang's HTTP server parses it
  (FastAPI validates the decoded JSON against the endpoint's declared type with
  pydantic: ``ChatCompletionRequest`` and ``CompletionRequest`` are pydantic models,
  whose ``model_fields_set`` says what the body set; ``GenerateReqInput`` is a
  dataclass, whose members the body set are those that differ from their defaults);
  for a handler that builds its request from another shape (``vertex_generate``), the
  members of the ``GenerateReqInput`` SGLang's own handler builds: the body is posted
  to SGLang's own FastAPI app at the handler's route, its validation, the handler and
  ``generate_request``'s contract check run as they are, and only what serves the
  built request (``serve_generate_request``, the tokenizer manager's way in) is
  replaced by a capture;
* ``formats``: per media member the request holds (``image_data``, ``video_data``,
  ``audio_data``), what SGLang's ``BaseMultimodalProcessor._get_preprocessed_input_format``
  says each item is (``PRECOMPUTED_EMBEDDING``, ``PROCESSOR_OUTPUT``, or ``null``: media
  to load);
* ``overrides``: what SGLang's ``apply_header_overrides`` (``/generate``, and the
  chat handler on the request it builds, when ``SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES``
  is set) writes into a ``GenerateReqInput`` from the headers;
* ``handlers``: what the OpenAI handlers take from the headers themselves
  (``extract_routing_key``: ``x-smg-routing-key``; ``extract_routed_dp_rank_from_header``:
  ``x-data-parallel-rank``), where not ``None``;
* ``error``: SGLang's refusal of the body (a validation error), else ``null``.

Values are printed as JSON (SGLang's msgspec structs as their builtins).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import sys
import types
from typing import Any

import msgspec
import pydantic
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sglang.srt.entrypoints import http_server
from sglang.srt.entrypoints.openai import protocol
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase
from sglang.srt.entrypoints.request_headers import apply_header_overrides
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor
from starlette.datastructures import Headers

MODELS: dict[str, Any] = {
    "ChatCompletionRequest": protocol.ChatCompletionRequest,
    "CompletionRequest": protocol.CompletionRequest,
    "GenerateReqInput": GenerateReqInput,
}
_UNSET = object()
MEDIA = ("image_data", "video_data", "audio_data")


class _Built:
    """SGLang's own app with ``serve_generate_request`` replaced by a capture of the
    request a handler built; nothing else of the server runs (no lifespan, so no
    tokenizer manager)."""

    def __init__(self) -> None:
        self.requests: list[GenerateReqInput] = []
        http_server.serve_generate_request = self._capture
        # An exception in the handler is what the server answers 500 for: an error here.
        self.client = TestClient(http_server.app, raise_server_exceptions=False)
        # The handler's route as SGLang registered it (AIP_PREDICT_ROUTE may move it).
        self.routes = {
            route.endpoint.__name__: route.path
            for route in http_server.app.routes
            if isinstance(route, APIRoute)
        }

    async def _capture(self, obj: GenerateReqInput, request: Any) -> Response:
        self.requests.append(obj)
        return Response(b"{}", media_type="application/json")

    def build(self, handler: str, body: bytes) -> GenerateReqInput:
        """The request ``handler`` builds from ``body``; raises with SGLang's answer
        when it builds none."""
        self.requests.clear()
        reply = self.client.post(
            self.routes[handler], content=body, headers={"content-type": "application/json"}
        )
        if reply.status_code != 200 or len(self.requests) != 1:
            raise ValueError(f"{reply.status_code} {reply.text}")
        return self.requests[0]


HANDLERS = ("vertex_generate",)


@functools.cache
def _app() -> _Built:
    """Made on the first handler case: a case of the models alone never patches it."""
    return _Built()


def _formats(members: dict[str, Any]) -> dict[str, list[str | None]]:
    formats: dict[str, list[str | None]] = {}
    for name in MEDIA:
        if members.get(name) is None:
            continue
        items, found = [members[name]], []
        while items:
            item = items.pop(0)
            if isinstance(item, list):
                items[:0] = item
                continue
            kind = BaseMultimodalProcessor._get_preprocessed_input_format(item)
            found.append(None if kind is None else kind.name)
        formats[name] = found
    return formats


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _UNSET


def _set_members(parsed: Any) -> dict[str, Any]:
    if isinstance(parsed, pydantic.BaseModel):
        return {name: getattr(parsed, name) for name in sorted(parsed.model_fields_set)}
    return {
        field.name: getattr(parsed, field.name)
        for field in dataclasses.fields(parsed)
        if getattr(parsed, field.name) != _default(field)
    }


def _overrides(headers: Headers) -> dict[str, Any]:
    target = GenerateReqInput(text="")
    before = {field.name: getattr(target, field.name) for field in dataclasses.fields(target)}
    apply_header_overrides(target, headers)
    return {
        name: getattr(target, name)
        for name, value in before.items()
        if getattr(target, name) != value
    }


def _handlers(headers: Headers) -> dict[str, Any]:
    # Their code reads nothing of the handler instance: called with none.
    raw_request = types.SimpleNamespace(headers=headers)
    read = {
        "routing_key": OpenAIServingBase.extract_routing_key(None, raw_request),
        "routed_dp_rank": OpenAIServingBase.extract_routed_dp_rank_from_header(
            None, raw_request, None
        ),
    }
    return {name: value for name, value in read.items() if value is not None}


def _jsonable(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    return pydantic.TypeAdapter(Any).dump_python(value, mode="json")


def read(case: dict[str, Any]) -> dict[str, Any]:
    body = json.loads(base64.b64decode(case["body_b64"]))
    raw = [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in case["headers"]
    ]
    headers = Headers(raw=raw)
    result: dict[str, Any] = {"members": {}, "error": None}
    try:
        if case["model"] in HANDLERS:
            parsed = _app().build(case["model"], base64.b64decode(case["body_b64"]))
        else:
            parsed = pydantic.TypeAdapter(MODELS[case["model"]]).validate_python(body)
    except (pydantic.ValidationError, ValueError) as exc:
        result["error"] = str(exc)
    else:
        result["members"] = _set_members(parsed)
    result["formats"] = _formats(result["members"])
    result["overrides"] = _overrides(headers)
    result["handlers"] = _handlers(headers)
    return result


def main() -> int:
    for line in sys.stdin:
        answer = [read(case) for case in json.loads(line)]
        sys.stdout.write(json.dumps(answer, default=_jsonable) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
