"""Flood-proof output capture: the first ``head`` and the last ``tail`` bytes of a stream, and how much was written.

A sandboxed program may print without end; what is kept never exceeds about ``head + 2 * tail`` bytes. The scorer
keeps both ends (its markers open and close the test output), the session runner only the tail, and diff
collection everything up to a cap (``head=cap``: ``overflowed`` says the cap was passed).
"""

from __future__ import annotations

__all__ = ["Capture"]

ELIDED = b"\n[... output truncated by floe ...]\n"


class Capture:
    def __init__(self, head: int, tail: int) -> None:
        self.head_limit = head
        self.tail_limit = tail
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data and self.tail_limit > 0:
            self._tail += data
            # Trim in bulk, not per write: amortised O(1) per byte.
            if len(self._tail) > 2 * self.tail_limit:
                del self._tail[: len(self._tail) - self.tail_limit]

    @property
    def overflowed(self) -> bool:
        """More was written than is kept."""
        return self.total > len(self._head) + min(len(self._tail), self.tail_limit)

    def data(self) -> bytes:
        """What is kept: everything while it fits; else the head, a truncation line (only between a head and a
        tail), and the tail."""
        tail = bytes(self._tail[-self.tail_limit :]) if self.tail_limit > 0 else b""
        if not self.overflowed or not self._head or not tail:
            return bytes(self._head) + tail
        return bytes(self._head) + ELIDED + tail

    def text(self) -> str:
        return self.data().decode("utf-8", errors="replace")
