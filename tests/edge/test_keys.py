import os

import pytest

from ext_proc.core.config import ConfigError, ProofKey
from ext_proc.edge.keys import KeyRing


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def key_file(tmp_path, name, secret):
    path = tmp_path / name
    path.write_bytes(secret)
    return ProofKey(id=name, file=str(path))


def test_the_first_key_signs_and_every_key_verifies(tmp_path):
    ring = KeyRing([key_file(tmp_path, "new", b"n" * 32), key_file(tmp_path, "old", b"o" * 40)])
    keys = ring.current()
    assert keys.signing == "new"
    assert keys.keys == {"new": b"n" * 32, "old": b"o" * 40}


def test_surrounding_whitespace_is_ignored(tmp_path):
    ring = KeyRing([key_file(tmp_path, "k", b"  " + b"s" * 32 + b"\n")])
    assert ring.current().keys["k"] == b"s" * 32


@pytest.mark.parametrize("secret", [b"q7Zp", b" " * 40])
def test_a_short_key_is_a_configuration_error_naming_the_file_not_the_key(tmp_path, secret):
    with pytest.raises(ConfigError, match="fewer than 32 bytes") as caught:
        KeyRing([key_file(tmp_path, "k", secret)])
    assert str(tmp_path) in str(caught.value)
    assert "q7Zp" not in str(caught.value)


def test_a_missing_file_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        KeyRing([ProofKey(id="k", file=str(tmp_path / "absent"))])


def test_no_files_means_no_signing_key():
    assert KeyRing([]).current().signing is None


def test_a_changed_file_is_picked_up_after_the_interval(tmp_path):
    clock = Clock()
    spec = key_file(tmp_path, "k", b"a" * 32)
    ring = KeyRing([spec], interval=1.0, clock=clock)
    # Kubernetes replaces a mounted secret through a new file and a symlink swap.
    replacement = tmp_path / "k.new"
    replacement.write_bytes(b"b" * 32)
    os.replace(replacement, spec.file)
    clock.now = 0.5
    assert ring.current().keys["k"] == b"a" * 32  # not checked yet
    clock.now = 1.0
    assert ring.current().keys["k"] == b"b" * 32


def test_a_broken_update_keeps_the_previous_key(tmp_path):
    clock = Clock()
    spec = key_file(tmp_path, "k", b"a" * 32)
    ring = KeyRing([spec], interval=1.0, clock=clock)
    with open(spec.file, "wb") as half_written:
        half_written.write(b"b" * 5)
    clock.now = 2.0
    assert ring.current().keys["k"] == b"a" * 32
