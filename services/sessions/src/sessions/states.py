"""One session's lifecycle: the current state, its ``seq`` and the transition table from ``contracts``.

``Lifecycle.to(state, reason)`` checks ``VALID_TRANSITIONS``, bumps ``seq`` and returns the ``SessionStateChanged``
to publish; an illegal transition is a bug in the runner and raises. Stage timings are measured here too, so
``SessionFinished.timings_ms`` and the state events agree.
"""

from __future__ import annotations

import time

from contracts import TERMINAL_STATES, VALID_TRANSITIONS, SessionRequested, SessionState, SessionStateChanged

__all__ = ["IllegalTransition", "Lifecycle"]


class IllegalTransition(RuntimeError):
    pass


class Lifecycle:
    def __init__(self, request: SessionRequested, node_id: str) -> None:
        self.request = request
        self.node_id = node_id
        self.state: SessionState | None = None
        self.seq = -1
        self.entered: dict[SessionState, float] = {}
        self.history: list[SessionStateChanged] = []

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def to(self, state: SessionState, reason: str | None = None) -> SessionStateChanged:
        if self.state is None:
            if state is not SessionState.REQUESTED:
                raise IllegalTransition(f"a session starts in REQUESTED, not {state.value}")
        elif state not in VALID_TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.state.value} -> {state.value}")
        event = SessionStateChanged(
            session_id=self.request.session_id,
            group_id=self.request.group_id,
            node_id=self.node_id,
            state=state,
            previous=self.state,
            seq=self.seq + 1,
            reason=reason,
        )
        self.state, self.seq = state, self.seq + 1
        self.entered[state] = time.monotonic()
        self.history.append(event)
        return event

    def stage_ms(self, start: SessionState, end: SessionState) -> float | None:
        if start in self.entered and end in self.entered:
            return (self.entered[end] - self.entered[start]) * 1000.0
        return None
