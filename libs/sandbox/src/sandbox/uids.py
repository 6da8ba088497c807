"""Distinct unprivileged uids for concurrent sandboxes.

RLIMIT_NPROC counts processes per uid, and a process may signal or ptrace any other of its uid; so two sandboxes
that must not share a process budget, or see each other, must not share a uid. The pool hands out
``first .. first + size - 1``, one lease per sandbox, and blocks while all are out. It is per process: two
processes given overlapping ranges do collide (give each its own ``first``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["UidPool"]


class UidPool:
    """Thread-safe. ``with pool.lease() as uid:`` blocks until a uid is free (async callers: in a thread)."""

    def __init__(self, first: int, size: int) -> None:
        if first < 1 or size < 1:
            raise ValueError("a uid pool needs first >= 1 and size >= 1")
        self.first = first
        self.size = size
        self._free = list(range(first, first + size))
        self._cond = threading.Condition()

    def acquire(self) -> int:
        with self._cond:
            while not self._free:
                self._cond.wait()
            return self._free.pop(0)

    def release(self, uid: int) -> None:
        with self._cond:
            if not self.first <= uid < self.first + self.size or uid in self._free:
                raise ValueError(f"uid {uid} is not leased from this pool")
            self._free.append(uid)
            self._cond.notify()

    @contextlib.contextmanager
    def lease(self) -> Iterator[int]:
        uid = self.acquire()
        try:
            yield uid
        finally:
            self.release(uid)
