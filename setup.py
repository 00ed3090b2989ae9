"""The compiled parts: every ``ext_proc/**/_*.c`` is one extension module of the same
dotted name (``ext_proc/core/_scan.c`` is ``ext_proc.core._scan``). Each has a pure-Python
reference beside it that the differential tests compare it with; the package runs on
the reference where a module was not built (``ext_proc.core.native`` says which runs)."""

from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).parent
# Portable code only (no -march): the wheel and the image run on any CPU of the platform.
FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"]


def extensions() -> list[Extension]:
    return [
        Extension(
            ".".join(source.relative_to(ROOT).with_suffix("").parts),
            sources=[str(source.relative_to(ROOT))],
            extra_compile_args=FLAGS,
        )
        for source in sorted((ROOT / "ext_proc").rglob("_*.c"))
    ]


setup(ext_modules=extensions())
