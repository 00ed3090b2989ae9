"""What an inventory says, per source: how many endpoints, fields, headers, part types and
connector keys it has, and which names are new against the previous release of the same
engine (the largest dotted-number release below it; a source named by a commit has
none). Names compare by value; fields by their last path step, as the classification
keys them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from devstack.inventory.model import Inventory, Source, paths, release_order


@dataclass(frozen=True)
class Names:
    """The names of one source the classification is keyed by, by kind."""

    endpoints: frozenset[str]
    fields: frozenset[str]
    headers: frozenset[str]
    part_types: frozenset[str]
    connector_keys: frozenset[str]

    @classmethod
    def of(cls, source: Source) -> Names:
        return cls(
            endpoints=frozenset(source.endpoints),
            fields=frozenset(
                path.rsplit(".", 1)[-1]
                for endpoint in source.endpoints
                for path in paths(source, endpoint)
            ),
            headers=frozenset(source.headers),
            part_types=frozenset(source.part_types),
            connector_keys=frozenset(source.connector_keys),
        )

    def by_kind(self) -> Mapping[str, frozenset[str]]:
        return {
            "endpoints": self.endpoints,
            "fields": self.fields,
            "headers": self.headers,
            "part types": self.part_types,
            "connector keys": self.connector_keys,
        }


def previous(inventory: Inventory, source: Source) -> Source | None:
    """The release of ``source``'s engine just below it, if any."""
    order = release_order(source.release)
    if order is None:
        return None
    below = [
        (found, other)
        for other in inventory.sources.values()
        if other.engine == source.engine
        and (found := release_order(other.release)) is not None
        and found < order
    ]
    return max(below, key=lambda pair: pair[0])[1] if below else None


def counts(source: Source) -> str:
    flattened = sum(len(paths(source, endpoint)) for endpoint in source.endpoints)
    names = Names.of(source)
    return (
        f"endpoints {len(source.endpoints)}, fields {flattened} "
        f"({len(names.fields)} names), headers {len(source.headers)}, "
        f"part types {len(source.part_types)}, connector keys {len(source.connector_keys)}"
    )


def lines(inventory: Inventory) -> Iterator[str]:
    """The report, a line per source, then a line per kind of name new since the
    previous release."""
    for key in sorted(inventory.sources, key=_order):
        source = inventory.sources[key]
        yield f"{key}: {counts(source)}"
        before = previous(inventory, source)
        if before is None:
            continue
        old = Names.of(before).by_kind()
        for kind, names in Names.of(source).by_kind().items():
            new = sorted(names - old[kind])
            if new:
                yield f"  new since {before.key}: {kind}: {', '.join(new)}"


def _order(key: str) -> tuple[str, bool, tuple[int, ...], str]:
    """By engine, then its numbered releases in order, then the ones named by commits."""
    engine, _, release = key.partition(" ")
    order = release_order(release)
    return engine, order is None, order or (), release
