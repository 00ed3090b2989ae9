"""devstack/release.py: the release facts read from pyproject.toml, the image references
the manifests get from them, and the wheel's version as its metadata states it."""

from __future__ import annotations

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
