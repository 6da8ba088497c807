"""``python -m rollout`` as real subprocesses over the real broker, and reading a topic back (for the kill tests)."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from contracts import Event
from eventbus import Consumer, KafkaSettings, Producer
from rollout.service import Topics


class Service:
    """One incarnation of ``python -m rollout``; stderr (JSON logs) is read on a thread into a queue."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollout"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.tail: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None:
                    pytest.fail(f"rollout service exited rc={self.proc.returncode}:\n{''.join(self.tail[-30:])}")
                continue
            self.tail.append(line)
            if text in line:
                return True
        return False

    def count(self, text: str) -> int:
        """Lines so far (read or not) that contain ``text``."""
        while True:
            try:
                self.tail.append(self.lines.get_nowait())
            except queue.Empty:
                break
        return sum(text in line for line in self.tail)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill9()


async def read_topic(kafka: KafkaSettings, topic: Any, isolation: str, settle_s: float = 1.5) -> list[Any]:
    out: list[Any] = []
    async with Consumer(
        kafka, [topic], group_id=f"check-{uuid.uuid4().hex}", config={"isolation.level": isolation}
    ) as c:
        while True:
            msg = await c.next(timeout_s=settle_s)
            if msg is None:
                return out
            out.append(msg.event)


async def publish(kafka: KafkaSettings, topics: Topics, events: list[Event]) -> None:
    async with Producer(kafka) as p:
        for event in events:
            await p.send(topics.for_event(event), event)
