"""The recorder's deadline: a broker that never acks makes the call fail (RecordUnavailable), and the send is
cancelled, not left running behind the error."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from contracts import CallTimings, ModelCallRecorded, Protocol, TokenizationMode
from gateway.errors import RecordUnavailable
from gateway.metrics import GatewayMetrics
from gateway.recorder import Recorder


class NeverAcks:
    def __init__(self) -> None:
        self.cancelled = False

    async def send(self, topic: Any, event: Any) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def _record() -> ModelCallRecorded:
    return ModelCallRecorded(
        session_id="s-1",
        group_id="g-1",
        call_index=0,
        call_id="c-1",
        protocol=Protocol.OPENAI_CHAT,
        tokenization=TokenizationMode.CANONICAL,
        model="policy",
        engine_id="http://engine",
        weight_version=0,
        prompt_token_ids=[1, 2, 3],
        prompt_len=3,
        completion_token_ids=[4],
        completion_logprobs=[-0.5],
        finish_reason="stop",
        timings=CallTimings(queue_ms=0.0, ttft_ms=1.0, total_ms=2.0),
        started_at=1,
    )


async def test_a_record_the_broker_never_acks_fails_the_call_in_time() -> None:
    sink = NeverAcks()
    metrics = GatewayMetrics()
    recorder = Recorder(
        sink, topic_name="floe.model-calls", metrics=metrics, max_pending=4, timeout_s=0.2, retry_after_s=1
    )
    started = time.monotonic()
    with pytest.raises(RecordUnavailable):
        await recorder.send(_record())
    assert time.monotonic() - started < 2.0
    assert sink.cancelled, "the send was left running after its deadline"
    assert recorder.pending == 0
    assert metrics.record_failures._value.get() == 1
