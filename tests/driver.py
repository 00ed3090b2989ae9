"""Drive a ``Stream`` the way the servicer does, keeping what it reported."""

from __future__ import annotations

from typing import Any

from ext_proc.events import Answer, Event, Outcome
from ext_proc.policy import Decision
from ext_proc.stream import State, Stream


class Driven:
    """``handle`` returns the answers; the one outcome is kept (a second one fails)."""

    def __init__(self, **options: Any) -> None:
        self.stream = Stream(**options)
        self.outcome: Outcome | None = None

    def handle(self, event: Event, *, sent: bool = True) -> list[Answer]:
        """``sent``: the answers went out, as the servicer reports after sending."""
        step = self.stream.handle(event)
        if sent:
            self.stream.sent()
        if step.outcome is not None:
            assert self.outcome is None, "a request's outcome is reported once"
            self.outcome = step.outcome
        return step.answers

    @property
    def state(self) -> State:
        return self.stream.state

    @property
    def waiting_for_body(self) -> bool:
        return self.stream.waiting_for_body

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
        self.stream.close()
