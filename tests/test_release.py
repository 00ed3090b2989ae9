"""devstack/release.py: the release facts read from pyproject.toml, the image references
the manifests get from them, and the wheel's version as its metadata states it."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import yaml

from devstack import release


def test_the_facts_are_pyprojects():
    assert release.version() == "0.2.0"
    assert release.image() == "ghcr.io/ext-proc-token-policy/ext-proc-token-policy"


def test_every_reference_to_the_processors_image_takes_the_name_and_version():
    text = (
        "        image: ghcr.io/example/ext-proc-token-policy:0.1.0\n"
        "          image: redis:7\n"
        "images:\n"
        "- name: ghcr.io/example/ext-proc-token-policy\n"
        "  newTag: 0.1.0\n"
    )
    reference = f"{release.image()}:{release.version()}"
    assert release.manifest(text) == (
        f"        image: {reference}\n"
        "          image: redis:7\n"
        "images:\n"
        f"- name: {release.image()}\n"
        f"  newTag: {release.version()}\n"
    )


def test_each_manifest_names_the_image_at_the_version():
    for path in release.MANIFESTS:
        text = path.read_text()
        if path.name == "Chart.yaml":
            chart = yaml.safe_load(text)
            assert chart["version"] == chart["appVersion"] == release.version()
            continue
        assert release.image() in text, path
        assert "ghcr.io/example/" not in text, path


def test_the_wheels_version_is_read_from_its_metadata(tmp_path):
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "x-1.0.dist-info/METADATA", "Metadata-Version: 2.4\nName: x\nVersion: 1.0\n"
        )
        archive.writestr("x/__init__.py", "")
    assert release.wheel_version(wheel) == "1.0"


def test_the_wheel_is_named_for_this_python_and_platform():
    name = release.wheel_name("1.2.3")
    assert name.startswith("ext_proc_token_policy-1.2.3-cp311-cp311-linux_")
    assert name.endswith(".whl")


def test_the_compiled_parts_are_read_from_the_wheels_names(tmp_path):
    wheel = tmp_path / "x-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("ext_proc/core/_scan.cpython-311-x86_64-linux-gnu.so", b"")
        archive.writestr("ext_proc/edge/wire.py", "")
        archive.writestr("ext_proc/core/native.py", "")
    assert release.compiled_parts(wheel) == {"core._scan"}


def test_the_wheel_built_from_the_checkout_holds_every_compiled_part(tmp_path):
    """What make release checks before it builds the image: the wheel this Python builds
    from the checkout is named as the Dockerfile copies it and carries each C source's
    module."""
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=release.REPO,
        check=True,
        capture_output=True,
    )
    wheel = tmp_path / release.wheel_name(release.version())
    assert wheel.is_file(), sorted(p.name for p in tmp_path.iterdir())
    sources = {
        ".".join(c.relative_to(release.REPO / "ext_proc").with_suffix("").parts)
        for c in (release.REPO / "ext_proc").rglob("_*.c")
    }
    assert release.compiled_parts(wheel) == sources
