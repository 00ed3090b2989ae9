"""report: counts per source, and the names new against the previous release of the same
engine (by release number, not by text; a commit has no previous release)."""

from __future__ import annotations

from devstack.inventory import model, report
from devstack.inventory.model import Source


def _source(release: str, engine: str = "vllm", **kwargs: object) -> Source:
    return Source(engine=engine, release=release, origin="test", **kwargs)  # type: ignore[arg-type]


OLD = _source(
    "0.9.0",
    endpoints={"POST /v1/chat/completions": "Chat"},
    models={"Chat": {"messages": ("list:Message",)}, "Message": {"role": ()}},
    headers=("x-request-id",),
    part_types=("text",),
    connector_keys=("remote_host",),
)
NEW = _source(
    "0.10.0",
    endpoints={"POST /v1/chat/completions": "Chat", "POST /sleep": None},
    models={"Chat": {"messages": ("list:Message",), "seed": ()}, "Message": {"role": ()}},
    headers=("x-request-id", "x-session-id"),
    part_types=("text", "prompt_embeds"),
    connector_keys=("remote_host",),
)
INVENTORY = model.inventory(
    [NEW, _source("0.2.0"), OLD, _source("1.0", engine="sglang"), _source("3f2a9c1b0d4e")]
)


def test_the_previous_release_is_the_largest_below() -> None:
    assert report.previous(INVENTORY, NEW) == OLD
    assert report.previous(INVENTORY, OLD) == INVENTORY.sources["vllm 0.2.0"]
    assert report.previous(INVENTORY, INVENTORY.sources["sglang 1.0"]) is None
    assert report.previous(INVENTORY, INVENTORY.sources["vllm 3f2a9c1b0d4e"]) is None


def test_counts_and_new_names() -> None:
    lines = list(report.lines(INVENTORY))
    assert lines[0] == (
        "sglang 1.0: endpoints 0, fields 0 (0 names), headers 0, part types 0, connector keys 0"
    )
    at = lines.index(
        "vllm 0.10.0: endpoints 2, fields 3 (3 names), headers 2, part types 2, connector keys 1"
    )
    assert lines[at + 1 :] == [
        "  new since vllm 0.9.0: endpoints: POST /sleep",
        "  new since vllm 0.9.0: fields: seed",
        "  new since vllm 0.9.0: headers: x-session-id",
        "  new since vllm 0.9.0: part types: prompt_embeds",
        "vllm 3f2a9c1b0d4e: endpoints 0, fields 0 (0 names), headers 0, part types 0, "
        "connector keys 0",
    ]
