"""``make release`` (``python -m devstack release``): the sdist and wheel in dist/, the
wheel's version checked against pyproject.toml's and its compiled parts present, and the
image tagged with it where a
Docker engine answers. Also the release facts the generated manifests take
(``manifests``): pyproject.toml states the version and, under ``[tool.ext-proc]``, the
image name, once."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any, Final

from ext_proc.core import native

REPO: Final = Path(__file__).resolve().parents[1]
PYPROJECT: Final = REPO / "pyproject.toml"
DIST: Final = REPO / "dist"
DOCKERFILE: Final = REPO / "deploy" / "Dockerfile"
# The manifests that name the image, each with the processor's image at the version.
# The chart's values.yaml and Chart.yaml are among them; deploy/kubernetes/deployment.yaml
# is the chart's render (devstack/helm.py), so it follows.
CHART: Final = REPO / "deploy" / "helm" / "ext-proc-token-policy"
MANIFESTS: Final = (
    CHART / "values.yaml",
    CHART / "Chart.yaml",
    REPO / "deploy" / "kubernetes" / "kustomization.yaml",
    REPO / "deploy" / "llm-d" / "routing-sidecar" / "component" / "kustomization.yaml",
)
# An image reference of the processor: any registry path ending in the project's name.
_REFERENCE: Final = re.compile(
    r"(?P<lead>(?:image|- name): )[\w.:/-]*/ext-proc-token-policy(?::\S+)?"
)
_NEW_TAG: Final = re.compile(r"(?P<lead>- name: [\w.:/-]*/ext-proc-token-policy\n\s+newTag: )\S+")
# The chart's image: its repository, the tag on the line after it, and the chart's versions.
_REPOSITORY: Final = re.compile(r"(?m)^(?P<lead>  repository: )[\w.:/-]*/ext-proc-token-policy$")
_TAG: Final = re.compile(r'(?m)(?P<lead>^  repository: \S+/ext-proc-token-policy\n  tag: )"[^"]*"')
_CHART_VERSION: Final = re.compile(r"(?m)^(?P<lead>(?:app)?[vV]ersion: ).*$")
# The image's Python (deploy/Dockerfile's base): the wheel holds compiled parts built for
# one CPython, so it is built by that version.
IMAGE_PYTHON: Final = (3, 11)


def _project() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def version() -> str:
    """pyproject.toml's version (what the installed metadata says once installed)."""
    return str(_project()["project"]["version"])


def image() -> str:
    """The image's name, without a tag."""
    return str(_project()["tool"]["ext-proc"]["image"])


def source() -> str:
    return str(_project()["project"]["urls"]["Source"])


def manifest(text: str) -> str:
    """``text`` with every reference to the processor's image at this name and version
    (a kustomization's ``images`` entry: its name, and its ``newTag``)."""
    named = _REFERENCE.sub(
        lambda m: m["lead"] + (image() if m["lead"] == "- name: " else f"{image()}:{version()}"),
        text,
    )
    named = _NEW_TAG.sub(lambda m: m["lead"] + version(), named)
    named = _REPOSITORY.sub(lambda m: m["lead"] + image(), named)
    return _TAG.sub(lambda m: m["lead"] + f'"{version()}"', named)


def chart(text: str) -> str:
    """Chart.yaml with the chart's version and appVersion at the package's."""
    return _CHART_VERSION.sub(lambda m: m["lead"] + version(), text)


def manifests() -> dict[Path, str]:
    return {
        path: (chart if path.name == "Chart.yaml" else manifest)(path.read_text())
        for path in MANIFESTS
    }


def wheel_version(wheel: Path) -> str:
    """The ``Version`` of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = HeaderParser().parsestr(archive.read(name).decode())
    return str(metadata["Version"])


def wheel_name(stated: str) -> str:
    """The wheel ``python -m build`` makes here: CPython's ABI and this machine's platform
    (its compiled parts inside), e.g. ``...-cp311-cp311-linux_x86_64.whl``; the image's
    platform is the machine's."""
    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"ext_proc_token_policy-{stated}-{abi}-{abi}-{platform}.whl"


def compiled_parts(wheel: Path) -> set[str]:
    """The compiled modules a wheel holds, by name under ext_proc (``core._scan``)."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            ".".join((*Path(name).parts[1:-1], Path(name).name.split(".", 1)[0]))
            for name in archive.namelist()
            if name.startswith("ext_proc/") and name.endswith(".so")
        }


def docker_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    done = subprocess.run([docker, "info"], capture_output=True, check=False, timeout=30)
    return done.returncode == 0


def build_command(name: str) -> list[str]:
    """The image's ``docker build``, tagged ``name:<version>``."""
    return [
        "docker", "build", "-f", str(DOCKERFILE.relative_to(REPO)),
        "--build-arg", f"VERSION={version()}", "--build-arg", f"SOURCE={source()}",
        "-t", f"{name}:{version()}", ".",
    ]  # fmt: skip


def release(name: str | None = None) -> int:
    """sdist and wheel into dist/, the wheel's version checked, the image built (or the
    command that would build it printed). 1 when the wheel's version differs."""
    stated = version()
    if sys.version_info[:2] != IMAGE_PYTHON:
        print(f"release: run with Python {'.'.join(map(str, IMAGE_PYTHON))}, the image's")
        return 1
    for old in DIST.glob("ext_proc_token_policy-*"):
        old.unlink()
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(DIST), str(REPO)], check=True)
    wheel = DIST / wheel_name(stated)
    found = wheel_version(wheel) if wheel.is_file() else "no wheel"
    if found != stated:
        print(f"release: the wheel's version is {found}, pyproject.toml's {stated}")
        return 1
    missing = set(native.PARTS) - compiled_parts(wheel)
    if missing:
        print(f"release: the wheel lacks the compiled parts {sorted(missing)}")
        return 1
    print(f"release: dist/ holds the sdist and wheel of {stated}")
    command = build_command(name or image())
    if not docker_answers():
        print(
            f"release: no Docker engine answers (docker info); image skipped: {shlex.join(command)}"
        )
        return 0
    return subprocess.run(command, cwd=REPO, check=False).returncode
