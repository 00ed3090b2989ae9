"""The results of a run, typed, and results.json, their serialized form.

``from_json`` reads the dict bench/run.py builds (or a results.json) once; ``to_json``
writes it back; everything between reads attributes. Every key is read into a field and
a key the model does not know is an error, so nothing is dropped on writing. An optional
key absent when read is absent when written, and each object's keys are written in
bench/run.py's order, so a results.json loads and dumps back to the same text.
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MIB = 1024 * 1024
BODY_ORDER = {"2k": 0, "64k": 1, "1m": 2}
DECISION_ORDER = {"allow": 0, "strip": 1, "deny": 2, "honor": 3, "honor-proven": 4, "strict": 5}
LABEL = {"2k": "2 KiB", "64k": "64 KiB", "1m": "1 MiB"}

Key = tuple[str, str, int]  # one cell of the matrix: body, decision, concurrency
Json = dict[str, Any]
T = TypeVar("T", bound="DataclassInstance")


def order(key: Key) -> tuple[int, int, int]:
    """A cell's place in the matrix: by body size, decision, then concurrency."""
    return BODY_ORDER[key[0]], DECISION_ORDER[key[1]], key[2]


class Absent(enum.Enum):
    """A key that results written before it existed lack (distinct from its null)."""

    KEY = "absent"


ABSENT = Absent.KEY


class _Fields:
    """The keys of one JSON object, each taken once; ``done`` refuses any left over."""

    def __init__(self, raw: Mapping[str, Any], what: str) -> None:
        self._left = dict(raw)
        self._what = what

    def take(self, key: str) -> Any:
        if key not in self._left:
            raise ValueError(f"{self._what}: no {key!r}")
        return self._left.pop(key)

    def optional(self, key: str) -> Any:
        """The value, None when absent: only for keys whose value is never null."""
        return self._left.pop(key, None)

    def present(self, key: str) -> bool:
        return key in self._left

    def done(self) -> None:
        if self._left:
            raise ValueError(f"{self._what}: unknown keys {sorted(self._left)}")


def _value(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _read(cls: type[T], raw: Mapping[str, Any], optional: frozenset[str] = frozenset()) -> T:
    """A dataclass of scalars (and lists, as tuples) whose keys are its field names."""
    f = _Fields(raw, cls.__name__)
    names = [field.name for field in fields(cls)]
    values = {n: _value(f.optional(n) if n in optional else f.take(n)) for n in names}
    f.done()
    return cls(**values)


def _write(obj: DataclassInstance, optional: frozenset[str] = frozenset()) -> Json:
    """The inverse of ``_read``: a field in ``optional`` that is None is left out."""
    out: Json = {}
    for field in fields(obj):
        value = getattr(obj, field.name)
        if value is None and field.name in optional:
            continue
        out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


ROLES = ("envoy", "processor", "upstream")  # in the order run.py writes their keys


@dataclass(frozen=True)
class Cpu:
    """CPU time (user + system, from /proc) per request, ms, of each process tree a
    measurement charges; None where there is none (direct has no processor)."""

    envoy: float | None = None
    processor: float | None = None
    upstream: float | None = None

    @classmethod
    def take(cls, f: _Fields) -> Cpu:
        return cls(*(f.optional(f"{role}_cpu_ms_per_req") for role in ROLES))

    def to_json(self) -> Json:
        values = (self.envoy, self.processor, self.upstream)
        return {
            f"{role}_cpu_ms_per_req": value
            for role, value in zip(ROLES, values, strict=True)
            if value is not None
        }


@dataclass(frozen=True)
class Round:
    """One arrangement's figures in one round of a cell."""

    rps: float
    p50_ms: float
    cpu: Cpu

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Round:
        f = _Fields(raw, "round")
        value = cls(f.take("rps"), f.take("p50_ms"), Cpu.take(f))
        f.done()
        return value

    def to_json(self) -> Json:
        return {"rps": self.rps, "p50_ms": self.p50_ms, **self.cpu.to_json()}


@dataclass(frozen=True)
class Relative:
    """A record against direct and naive in its cell (bench/judge.py ``enrich``); None
    where the other is not measured there or a ratio has no denominator."""

    added_p50_ms: float | None  # p50 minus direct's
    p50_x_direct: float | None
    rps_x_direct: float | None
    added_x_naive: float | None  # added p50 over naive's added p50
    rps_x_naive: float | None


_HEAD = (
    "body",
    "body_bytes",
    "decision",
    "path",
    "id_count",
    "concurrency",
    "arrangement",
    "expected_status",
    "probe_status",
    "probe_reason",
)
_MEDIANS = ("rps", "p50_ms", "p90_ms", "p99_ms", "mean_ms")
_TOTALS = ("requests", "seconds", "non_2xx", "socket_errors", "max_ms")


@dataclass(frozen=True)
class Record:
    """One arrangement measured in one cell: its probe, the medians of its rounds (CPU
    included), totals, the largest latency, and each round's figures."""

    body: str
    body_bytes: int
    decision: str
    path: str
    id_count: int
    concurrency: int
    arrangement: str
    expected_status: int
    probe_status: int
    probe_reason: str | None
    # The service's decisions over every round by reason; None: not a service; ABSENT:
    # results from before reasons were kept.
    reasons: Mapping[str, int] | Absent | None
    ok: bool  # every answer as the body expects
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    cpu: Cpu
    requests: int
    seconds: float
    non_2xx: int
    socket_errors: int
    max_ms: float
    rounds: tuple[Round, ...] | None = None  # None: not kept
    relative: Relative | None = None  # None: not enriched yet

    @property
    def key(self) -> Key:
        return self.body, self.decision, self.concurrency

    def added_rounds(self, direct: Record | None) -> list[float] | None:
        """Each round's p50 minus ``direct``'s in the same round (rounds paired by
        order); None when either has no rounds or they differ in number."""
        if self.rounds is None or direct is None or direct.rounds is None:
            return None
        if len(self.rounds) != len(direct.rounds):
            return None
        return [r.p50_ms - d.p50_ms for r, d in zip(self.rounds, direct.rounds, strict=True)]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Record:
        f = _Fields(raw, "cell record")
        head = {name: f.take(name) for name in _HEAD}
        reasons = f.take("reasons") if f.present("reasons") else ABSENT
        ok = f.take("ok")
        medians = {name: f.take(name) for name in _MEDIANS}
        cpu = Cpu.take(f)
        totals = {name: f.take(name) for name in _TOTALS}
        rounds = f.optional("rounds")
        relative = None
        if f.present("added_p50_ms"):  # enriched: every field of Relative is there
            relative = Relative(**{field.name: f.take(field.name) for field in fields(Relative)})
        f.done()
        return cls(
            **head,
            reasons=reasons,
            ok=ok,
            **medians,
            cpu=cpu,
            **totals,
            rounds=None if rounds is None else tuple(Round.from_json(r) for r in rounds),
            relative=relative,
        )

    def to_json(self) -> Json:
        out: Json = {name: getattr(self, name) for name in _HEAD}
        if self.reasons is not ABSENT:
            out["reasons"] = self.reasons
        out["ok"] = self.ok
        out |= {name: getattr(self, name) for name in _MEDIANS}
        out |= self.cpu.to_json()
        out |= {name: getattr(self, name) for name in _TOTALS}
        if self.rounds is not None:
            out["rounds"] = [r.to_json() for r in self.rounds]
        if self.relative is not None:
            out |= _write(self.relative)
        return out


def by_cell(records: Iterable[Record]) -> dict[Key, dict[str, Record]]:
    """The records of each cell by arrangement, the cells in matrix order."""
    cells: dict[Key, dict[str, Record]] = defaultdict(dict)
    for record in records:
        cells[record.key][record.arrangement] = record
    return dict(sorted(cells.items(), key=lambda item: order(item[0])))


@dataclass(frozen=True)
class Arrangement:
    name: str
    kind: str  # direct, naive, service or ledger
    workers: int | None
    default: bool  # the shipped default: the one arrangement the targets judge


@dataclass(frozen=True)
class Meta:
    """How and where the run measured; the optional fields are absent from older runs."""

    started: str
    mode: str  # full or smoke
    cells: str | None  # matrix, smoke or targets
    records: tuple[str, ...] | None  # the records of spent proofs measured
    seconds_per_cell: int
    warmup_seconds: int
    rounds: int | None
    wrk_threads: int
    cpus: int | None
    machine: str
    python: str
    envoy: str
    nginx: str
    wrk: str
    service_workers_option: bool
    record_slots: int | None = None
    proof_lifetime_seconds: int | None = None
    redis: str | None = None
    cpu_model: str | None = None  # the processor's model name (/proc/cpuinfo)
    commit: str | None = None  # the code measured (git describe --always --dirty)
    packages: tuple[str, ...] | None = None  # "name version" of the Python packages


_META_OPTIONAL = frozenset(
    {
        "cells",
        "records",
        "rounds",
        "record_slots",
        "proof_lifetime_seconds",
        "redis",
        "cpu_model",
        "commit",
        "packages",
    }
)


@dataclass(frozen=True)
class TargetRow:
    """One check of one target in one cell: the default's figure over the floor's."""

    target: int
    arrangement: str | None  # the default; None unless exactly one is marked
    floor: str
    cell: str
    measure: str
    value: float | None  # the ratio judged
    limit: float
    threshold: str
    default_value: float | None
    floor_value: float | None
    unit: str
    detail: str
    rounds: tuple[float, ...]  # each round's ratio
    rounds_met: int
    status: str  # met, missed, not measured or undetermined
    informational: bool  # reported beside the target, never counted in its status


@dataclass(frozen=True)
class TargetSummary:
    target: int
    title: str
    arrangement: str | None
    floor: str
    status: str
    checks_met: int
    checks: int


@dataclass(frozen=True)
class Slope:
    """Added p50 per MiB of body, fitted over the body sizes measured."""

    arrangement: str
    decision: str
    concurrency: int
    ms_per_mib: float | None  # None without two sizes
    sizes: int


@dataclass(frozen=True)
class ProofCost:
    """``honor-proven`` against ``honor`` for one service arrangement and cell."""

    arrangement: str
    body: str
    body_bytes: int
    id_count: int
    concurrency: int
    honor_p50_ms: float
    proven_p50_ms: float
    added_p50_ms: float | None
    honor_cpu_ms_per_req: float | None
    proven_cpu_ms_per_req: float | None
    added_cpu_ms_per_req: float | None
    ok: bool
    # Latency added over Envoy direct, proven over unproven: the median of the rounds'
    # ratios and each round's (rounds paired by order); None in results from before.
    added_ratio: float | None = None
    added_ratio_rounds: tuple[float, ...] | None = None


_PROOF_COST_OPTIONAL = frozenset({"added_ratio", "added_ratio_rounds"})


@dataclass(frozen=True)
class RecordCost:
    """A proven cell with the local record of spent proofs and with Redis, beside
    ``honor``: latencies added over direct, their ratios, processor CPU per request."""

    arrangement: str
    redis_arrangement: str
    body: str
    body_bytes: int
    concurrency: int
    honor_added_p50_ms: float | None
    local_added_p50_ms: float | None
    redis_added_p50_ms: float | None
    local_x_honor: float | None
    redis_x_honor: float | None
    redis_x_local: float | None
    redis_minus_local_p50_ms: float | None
    honor_cpu_ms_per_req: float | None
    local_cpu_ms_per_req: float | None
    redis_cpu_ms_per_req: float | None
    ok: bool


@dataclass(frozen=True)
class StrictCost:
    """``strict`` against ``allow`` (the same bytes on a ``strict_body`` route) for one
    service arrangement, body size and concurrency; the ratios are strict over allow,
    of the cells' medians (None without a denominator). The floor's requests/s in both
    cells show how the machine moved between them: the route changes nothing for it."""

    arrangement: str
    body: str
    body_bytes: int
    concurrency: int
    allow_rps: float
    strict_rps: float
    rps_ratio: float | None
    allow_p50_ms: float
    strict_p50_ms: float
    p50_ratio: float | None
    allow_added_p50_ms: float | None  # over Envoy direct in the same cell
    strict_added_p50_ms: float | None
    allow_cpu_ms_per_req: float | None  # the processor's
    strict_cpu_ms_per_req: float | None
    cpu_ratio: float | None
    floor_allow_rps: float | None  # None: the floor was not measured
    floor_strict_rps: float | None
    # rps_ratio with each cell's req/s over the floor's in that cell first.
    rps_ratio_over_floor: float | None
    ok: bool


@dataclass(frozen=True)
class LedgerRow:
    """One rung of the cost ledger in one cell (bench/ladder.py): its figures, what it
    adds over the rung before it on its ladder (None on the first) and its figures over
    the floor's in the cell (None without the floor or a denominator)."""

    ladder: str  # envoy, processor or compiled
    arrangement: str
    adds: str
    body: str
    body_bytes: int
    decision: str
    concurrency: int
    rps: float
    processor_cpu_ms_per_req: float | None
    envoy_cpu_ms_per_req: float | None
    processor_added_ms: float | None
    envoy_added_ms: float | None
    rps_x_floor: float | None
    processor_x_floor: float | None
    envoy_x_floor: float | None
    ok: bool
    # Latency, so that a cell at c=1 shows what a rung adds to it: the p50 and the p50
    # minus direct's in the cell (None without direct); both None in ledgers from
    # before they were kept (absent from their results.json).
    p50_ms: float | None = None
    added_p50_ms: float | None = None


_LEDGER_OPTIONAL = frozenset({"p50_ms", "added_p50_ms"})


@dataclass(frozen=True)
class Derived:
    """What bench/judge.py derives from the measurements."""

    targets: tuple[TargetRow, ...]
    target_summary: tuple[TargetSummary, ...]
    slopes: tuple[Slope, ...]
    verification: tuple[ProofCost, ...]
    records: tuple[RecordCost, ...] | None  # None: results from before record rows
    strict: tuple[StrictCost, ...] | None = None  # None: results from before strict rows
    ledger: tuple[LedgerRow, ...] | None = None  # None: results from before the ledger

    @classmethod
    def from_json(cls, f: _Fields) -> Derived:
        records = f.optional("records")
        strict = f.optional("strict")
        ledger = f.optional("ledger")
        return cls(
            tuple(_read(TargetRow, r) for r in f.take("targets")),
            tuple(_read(TargetSummary, r) for r in f.take("target_summary")),
            tuple(_read(Slope, r) for r in f.take("slopes")),
            tuple(_read(ProofCost, r, _PROOF_COST_OPTIONAL) for r in f.take("verification")),
            None if records is None else tuple(_read(RecordCost, r) for r in records),
            None if strict is None else tuple(_read(StrictCost, r) for r in strict),
            None
            if ledger is None
            else tuple(_read(LedgerRow, r, _LEDGER_OPTIONAL) for r in ledger),
        )

    def to_json(self) -> Json:
        out = {
            "targets": [_write(r) for r in self.targets],
            "target_summary": [_write(r) for r in self.target_summary],
            "slopes": [_write(r) for r in self.slopes],
            "verification": [_write(r, _PROOF_COST_OPTIONAL) for r in self.verification],
        }
        if self.records is not None:
            out["records"] = [_write(r) for r in self.records]
        if self.strict is not None:
            out["strict"] = [_write(r) for r in self.strict]
        if self.ledger is not None:
            out["ledger"] = [_write(r, _LEDGER_OPTIONAL) for r in self.ledger]
        return out


@dataclass(frozen=True)
class Results:
    """A run: what bench/run.py measured, and what bench/judge.py derived (None before)."""

    meta: Meta
    notes: tuple[str, ...]
    arrangements: tuple[Arrangement, ...]
    cells: tuple[Record, ...]
    # Envoy's counters per arrangement at the end of the run, by Envoy's stat name.
    envoy_stats: Mapping[str, Mapping[str, int]]
    derived: Derived | None = None

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.arrangements]

    @property
    def default(self) -> str | None:
        """The arrangement marked default; None unless exactly one is."""
        marked = [a.name for a in self.arrangements if a.default]
        return marked[0] if len(marked) == 1 else None

    @property
    def judged(self) -> Derived:
        if self.derived is None:
            raise ValueError("the results are not judged yet (bench/judge.py judge)")
        return self.derived


def from_json(raw: Mapping[str, Any]) -> Results:
    """The one way in: bench/run.py's dict, or a results.json parsed."""
    f = _Fields(raw, "results")
    results = Results(
        _read(Meta, f.take("meta"), _META_OPTIONAL),
        tuple(f.take("notes")),
        tuple(_read(Arrangement, a) for a in f.take("arrangements")),
        tuple(Record.from_json(r) for r in f.take("cells")),
        f.take("envoy_stats"),
        Derived.from_json(f) if f.present("targets") else None,
    )
    f.done()
    return results


def to_json(results: Results) -> Json:
    """The one way out: the inverse of ``from_json``."""
    out: Json = {
        "meta": _write(results.meta, _META_OPTIONAL),
        "notes": list(results.notes),
        "arrangements": [_write(a) for a in results.arrangements],
        "cells": [r.to_json() for r in results.cells],
        "envoy_stats": {name: dict(stats) for name, stats in results.envoy_stats.items()},
    }
    if results.derived is not None:
        out |= results.derived.to_json()
    return out


def dumps(results: Results) -> str:
    """results.json's text."""
    return json.dumps(to_json(results), indent=2) + "\n"


def load(path: Path) -> Results:
    return from_json(json.loads(path.read_text()))
