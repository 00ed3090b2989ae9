"""Every committed generated file is its generator's output (devstack/generated.py):
one case per (generator, file). `make generate` rewrites whatever a case finds stale."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from devstack import generated
from devstack.generated import GENERATORS, Generator

PAIRS = [
    pytest.param(generator, path, id=f"{generator.name}:{path.relative_to(generated.REPO)}")
    for generator in GENERATORS
    for path in generator.outputs()
]


@functools.cache
def files(generator: Generator) -> dict[Path, str]:
    """Each generator runs once per session, however many files it writes."""
    return generator.files()


@pytest.mark.parametrize(("generator", "path"), PAIRS)
def test_a_committed_file_is_its_generators_output(generator: Generator, path: Path) -> None:
    assert path.read_text() == files(generator)[path], (
        f"{path} differs from what {generator.name} writes: run `make generate`"
    )


@pytest.mark.parametrize("generator", GENERATORS, ids=lambda generator: generator.name)
def test_a_generator_writes_exactly_the_files_it_lists(generator: Generator) -> None:
    assert sorted(files(generator)) == sorted(generator.outputs())
