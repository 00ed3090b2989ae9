"""Drive a ``Stream`` the way the servicer does, keeping what it reported."""

from __future__ import annotations

import time
from typing import Any

from ext_proc.core import memory, replay
from ext_proc.core.budget import Budget
from ext_proc.core.config import Config
from ext_proc.core.decisions import Decision
from ext_proc.core.events import Answer, Event, Outcome, Step
from ext_proc.core.proof import Trust
from ext_proc.core.stream import State, Stream
from ext_proc.edge.record import LocalRecord


def config(**fields: Any) -> Config:
    """A processor configuration for tests: the defaults, with ``fields``, and a budget
    that holds the largest body unless one is given."""
    largest = memory.largest(
        fields.get("max_body_bytes", 16 << 20), fields.get("max_json_values", 262_144)
    )
    slots = fields.get("proof", {}).get("record_slots", 65536)
    fields.setdefault("inflight_budget_bytes", largest + replay.table_bytes(slots))
    return Config.model_validate(fields)


DAY = 86400


class Driven:
    """``handle`` returns the answers; the last outcome is kept (a phase reported twice
    fails)."""

    def __init__(
        self,
        *,
        budget: Budget | None = None,
        trust: Trust | None = None,
        spent: LocalRecord | None = None,
        **fields: Any,
    ) -> None:
        self.config = config(**fields)
        self.budget = budget if budget is not None else Budget(self.config.inflight_budget_bytes)
        self.stream = Stream(self.config, self.budget, trust)
        # The record a proof is spent in, as the servicer's (one per stream unless given),
        # of a processor that has run for a day: it honors proofs minted before the stream.
        clock = trust.clock if trust is not None else time.time
        if spent is None:
            spent = LocalRecord.anonymous(64, clock, began=clock() - DAY)
        self.spent = spent
        self.outcome: Outcome | None = None
        self.last: Step | None = None
        self._held = 0  # what the last step's answers carry, until they are "sent"
        self._phases: set[str] = set()

    def handle(self, event: Event, *, sent: bool = True) -> list[Answer]:
        """``sent``: the answers went out, and the servicer released what they held."""
        self.release()
        step = self.stream.handle(event)
        if step.ask is not None:
            step = self.stream.spent(self.spent.spend_now(step.ask))
        self.last = step
        self._held = step.held
        if sent:
            self.release()
        if step.outcome is not None:
            assert step.outcome.phase not in self._phases, "each phase is reported once"
            self._phases.add(step.outcome.phase)
            self.outcome = step.outcome
        return step.answers

    def release(self) -> None:
        """What the last answers carried, released as the servicer does once sent."""
        self.budget.release(self._held)
        self._held = 0

    @property
    def state(self) -> State:
        return self.stream.state

    @property
    def waiting_for_body(self) -> bool:
        return self.last is not None and self.last.waiting_for_body

    @property
    def decision(self) -> Decision | None:
        return None if self.outcome is None else self.outcome.decision

    @property
    def audit(self) -> bool:
        assert self.outcome is not None
        return self.outcome.audit

    @property
    def route_name(self) -> str:
        assert self.outcome is not None
        return self.outcome.route

    def close(self) -> None:
        self.release()
        self.stream.close()
