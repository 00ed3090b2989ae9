"""SGLang's own request models, in a cached environment of their own, for the sglang tier.

Stdlib and the project's own modules; nothing happens at import time.

* ``ensure_venv()`` -- ``sglang-venv`` under ``${EXT_PROC_CACHE:-~/.cache/ext-proc}``:
  the SGLang wheel the inventory read (``sglang==0.5.23``, its sha256 checked against
  the inventory's ``origin``), installed without its dependencies, and only what
  ``sglang.srt.entrypoints.openai.protocol`` and ``sglang.srt.managers.io_struct``
  import. Nothing is stubbed: ``io_struct`` imports torch, and through the scheduler's
  modules the model configs (InternVL's imports torchvision) and the quantization
  layers, so torch, torchvision, triton, transformers and a few others come along.
  torch is the release SGLang pins (2.14.1, PyPI's CUDA build, which runs on a CPU):
  PyPI's torchvision loads only next to PyPI's torch (with the CPU build on this
  machine's disk it fails on ``torchvision::nms``), and the CPU builds of both are not
  on PyPI. About 6 GB; a stamp file records what was installed, and without a
  matching one the environment is rebuilt.
  What SGLang's HTTP server module imports besides (uvicorn, xgrammar, ...: the
  handlers that build a request) is added on top, with a stamp of its own.
* ``Parser`` -- ``parse_request.py`` running in that environment: given request bodies
  (their bytes) and headers, what SGLang's own code reads from each.

``python -m tests.sglang.sglang_env`` (from the checkout) prepares the environment and
prints its python.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.inventory import model, wheels
from tests.conformance import vllm_env

ENGINE = "sglang"
RELEASE = "0.5.23"
SOURCE = f"{ENGINE} {RELEASE}"  # the inventory's key
# What protocol.py and io_struct.py import, module by module (found by importing them
# until nothing was missing), at the releases SGLang 0.5.23 pins where it pins one.
REQUIREMENTS = (
    "torch==2.14.1",
    "torchvision==0.29.1",
    "triton",
    "transformers==5.19.0",
    "compressed-tensors==0.18.0",
    "apache-tvm-ffi==0.1.11",
    "sentencepiece==0.2.1",
    "openai==2.8.0",
    "pydantic",
    "msgspec",
    "orjson",
    "numpy",
    "psutil",
    "pybase64",
    "requests",
    "pillow",
    "packaging",
    "fastapi",
    "pyzmq",
    "IPython",
    "aiohttp",
    "dill",
    "gguf",
    "partial_json_parser",
)
IMPORTS = ("sglang.srt.entrypoints.openai.protocol", "sglang.srt.managers.io_struct")
# What SGLang's HTTP server module imports beyond those (found the same way), for the
# handlers that build a request from another shape (``vertex_generate``): SGLang's pins
# where it pins one; jsonschema is outlines' (pinned by SGLang), imported by serving_chat.
# Installed on top of the models' environment with a stamp of its own, so adding to it
# never reinstalls torch.
HANDLER_REQUIREMENTS = (
    "uvicorn>=0.51",
    "uvloop",
    "setproctitle",
    "einops",
    "jsonschema",
    "xgrammar==0.2.7",
    "soundfile==0.13.1",
    "python-multipart",
)
HANDLER_IMPORTS = ("sglang.srt.entrypoints.http_server",)
HELPER = Path(__file__).resolve().with_name("parse_request.py")


def _log(msg: str) -> None:
    print(f"[sglang_env] {msg}", file=sys.stderr, flush=True)


def venv_dir() -> Path:
    return vllm_env.cache_dir() / "sglang-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def wheel() -> wheels.Wheel:
    (found,) = (w for w in wheels.WHEELS if (w.engine, w.release) == (ENGINE, RELEASE))
    return found


def inventory_sha256() -> str:
    """The sha256 of the wheel the inventory read (its ``origin``)."""
    source = model.loads(model.INVENTORY.read_text()).sources[SOURCE]
    return source.origin.rpartition("sha256:")[2]


def stamp_text() -> str:
    return f"{wheel().requirement} sha256:{inventory_sha256()}; {' '.join(REQUIREMENTS)}\n"


def handler_stamp_text() -> str:
    return f"{stamp_text().strip()}; {' '.join(HANDLER_REQUIREMENTS)}\n"


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    root = vllm_env.cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock-sglang", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_venv() -> Path:
    """The environment's python, creating the environment when needed and adding the
    HTTP server's imports when they are missing. Raises when the wheel is not the one
    the inventory read, or a module does not import."""
    with _lock():
        py = _ensure_models()
        stamp = venv_dir() / ".ext-proc-handlers-installed"
        if stamp.exists() and stamp.read_text() == handler_stamp_text():
            return py
        started = time.monotonic()
        _log("adding what SGLang's HTTP server imports")
        # With the models' requirements, so that no pin of theirs moves.
        pip = [py, "-m", "pip", "install", "--progress-bar", "off", "--quiet"]
        vllm_env.run([*pip, *REQUIREMENTS, *HANDLER_REQUIREMENTS])
        vllm_env.run([py, "-c", "; ".join(f"import {m}" for m in (*IMPORTS, *HANDLER_IMPORTS))])
        stamp.write_text(handler_stamp_text())
        _log(f"HTTP server's imports ready in {time.monotonic() - started:.0f}s")
        return py


def _ensure_models() -> Path:
    """The environment with SGLang's request models (held under ``_lock``)."""
    vdir, py = venv_dir(), venv_python()
    stamp = vdir / ".ext-proc-installed"
    if py.exists() and stamp.exists() and stamp.read_text() == stamp_text():
        return py
    if vdir.exists():
        _log(f"removing incomplete or outdated venv {vdir}")
        shutil.rmtree(vdir)
    path = wheels.download(wheel(), wheels.cache())
    if wheels.sha256(path) != inventory_sha256():
        raise RuntimeError(f"{path} is not the wheel the inventory read ({SOURCE})")
    started = time.monotonic()
    _log(f"creating venv {vdir}: {path.name} without its dependencies, and what it imports")
    vllm_env.run([sys.executable, "-m", "venv", vdir])
    pip = [py, "-m", "pip", "install", "--progress-bar", "off", "--quiet"]
    vllm_env.run([*pip, "--no-deps", path])
    vllm_env.run([*pip, *REQUIREMENTS])
    vllm_env.run([py, "-c", "; ".join(f"import {module}" for module in IMPORTS)])
    stamp.write_text(stamp_text())
    _log(f"venv ready in {time.monotonic() - started:.0f}s: {py}")
    return py


# --- what SGLang reads ------------------------------------------------------------------

# The request model each case is parsed with, as SGLang's HTTP server declares it, and
# the handlers whose built request is read instead (parse_request.HANDLERS).
MODELS = ("ChatCompletionRequest", "CompletionRequest", "GenerateReqInput", "vertex_generate")


@dataclass(frozen=True)
class Case:
    """A body (its exact bytes) and the headers it came with, to parse with ``model``."""

    model: str
    body: bytes
    headers: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True)
class Reading:
    """What SGLang's code reads from one case: the members its model parse set (their
    values as JSON), the attributes its header overrides set on a ``GenerateReqInput``,
    what its OpenAI handlers take from headers (``routing_key``, ``routed_dp_rank``),
    SGLang's refusal of the body (its validation error, or a handler's answer when it
    builds no request) if it refuses it, and per media member the preprocessed format
    SGLang's multimodal processor finds in each item (``None``: media to load)."""

    members: Mapping[str, Any]
    overrides: Mapping[str, Any]
    handlers: Mapping[str, Any]
    error: str | None
    formats: Mapping[str, Sequence[str | None]]


class Parser:
    """``parse_request.py`` running in the environment: SGLang imported once, then
    each ``read`` answered in turn. A context manager; raises with the helper's
    standard error when it fails or stops."""

    def __init__(self, log: Path) -> None:
        self._log = log
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Parser:
        py = ensure_venv()
        with self._log.open("w") as errors:
            self._process = subprocess.Popen(
                [str(py), str(HELPER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
        return self

    def __exit__(self, *_: object) -> None:
        process = self._process
        if process is not None:
            assert process.stdin is not None
            assert process.stdout is not None
            process.stdin.close()  # the helper ends at the end of its input
            process.wait(timeout=30)
            process.stdout.close()

    def read(self, cases: Sequence[Case]) -> list[Reading]:
        """Each case as SGLang's own code reads it."""
        process = self._process
        assert process is not None
        assert process.stdin is not None
        assert process.stdout is not None
        document = [
            {
                "model": case.model,
                "body_b64": base64.b64encode(case.body).decode(),
                "headers": [list(pair) for pair in case.headers],
            }
            for case in cases
        ]
        try:
            process.stdin.write(json.dumps(document) + "\n")
            process.stdin.flush()
        except BrokenPipeError:
            pass  # reported below, with the helper's own words
        line = process.stdout.readline()
        if not line:
            process.wait(timeout=30)
            tail = self._log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"parse_request.py stopped ({process.returncode}):\n{tail}")
        return [
            Reading(r["members"], r["overrides"], r["handlers"], r["error"], r["formats"])
            for r in json.loads(line)
        ]


def main() -> int:
    py = ensure_venv()
    print(f"{wheel().requirement}: {py}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
