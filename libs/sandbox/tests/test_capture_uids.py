"""Output capture and the uid pool: pure, no sandbox."""

from __future__ import annotations

import threading
import time

import pytest

from sandbox import Capture, UidPool


def test_tail_only_is_bounded() -> None:
    tail = Capture(0, 10)
    for _ in range(1000):
        tail.write(b"0123456789abc")
    assert tail.text() == ("0123456789abc" * 2)[-10:]
    assert tail.total == 13_000 and tail.overflowed


def test_head_and_tail_with_a_truncation_line() -> None:
    cap = Capture(4, 4)
    cap.write(b"abcd")
    assert cap.data() == b"abcd" and not cap.overflowed
    cap.write(b"efgh")
    assert cap.data() == b"abcdefgh" and not cap.overflowed  # fits head + tail: everything, no marker
    cap.write(b"ijkl")
    assert cap.data() == b"abcd\n[... output truncated by floe ...]\nijkl" and cap.overflowed


def test_head_only_is_a_cap() -> None:
    cap = Capture(5, 0)
    cap.write(b"12345")
    assert cap.data() == b"12345" and not cap.overflowed
    cap.write(b"6")
    assert cap.data() == b"12345" and cap.overflowed and cap.total == 6


def test_uid_pool_hands_out_distinct_uids_and_blocks_when_empty() -> None:
    pool = UidPool(70_000, 2)
    with pool.lease() as a, pool.lease() as b:
        assert {a, b} == {70_000, 70_001}
        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(pool.acquire()))
        waiter.start()
        time.sleep(0.1)
        assert got == []  # both are out
    waiter.join(timeout=5)
    assert got and got[0] in (70_000, 70_001)
    pool.release(got[0])
    with pytest.raises(ValueError, match="not leased"):
        pool.release(70_000)
    with pytest.raises(ValueError):
        UidPool(0, 1)
