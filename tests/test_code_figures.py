"""devstack.code_figures: the figures come from the source it is pointed at."""

from pathlib import Path

from devstack import code_figures


def test_figures_of_a_small_tree(tmp_path: Path) -> None:
    core = tmp_path / "ext_proc" / "core"
    core.mkdir(parents=True)
    (tmp_path / "ext_proc" / "__init__.py").write_text("")
    body = "\n".join(f"    x{n} = {n}" for n in range(55))
    (core / "stream.py").write_text(
        "class Stream:\n"
        "    def __init__(self):\n        self.a = 1\n"
        "    def handle(self):\n        self.state = 2\n        self.b, self.c = 1, 2\n"
        f"def long():\n{body}\n"
    )
    figures = code_figures.report(tmp_path).splitlines()
    assert "  ext_proc/core/: 1, 62" in figures
    assert "functions over 50 lines: 1" in figures
    assert "    56 ext_proc/core/stream.py:long" in figures
    assert "core/stream.py: 62 lines" in figures
    assert "attributes Stream's handlers write: 3 (b, c, state)" in figures
