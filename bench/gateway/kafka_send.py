"""What one acknowledged Kafka send costs the sending process in CPU, hot and after the process sat idle.

The gateway records every call and ends it only once the broker acknowledged the record, so as deployed each call
pays one send. ``run.py`` measures that inside the gateway (its Kafka columns beside the file sink); this script
isolates it: one process on its own core sends real ``ModelCallRecorded`` records one at a time to a real broker
(``LocalBroker``, on the other core), waits for each ack, and then sleeps ``gap`` ms before the next, as a gateway
serving one session waits on the engine between two records. Columns, interleaved round by round:

- *idle only*: the same loop without the send (what the sleep and the wake-up cost by themselves);
- *eventbus.Producer*: what floe sends with (librdkafka: the event loop produces, librdkafka's broker thread sends and
  reads the ack, the producer's poll thread hands it back to the loop);
- *aiokafka*: an asyncio-native client (no threads: the event loop itself writes the request and reads the ack),
  idempotent with acks=all as the gateway's producer is.

CPU is summed over the process's threads (``/proc/self/task/*/schedstat``, ns) and reported per send above the idle
column of the same gap, with eventbus's split by thread. Figures go to ``.floe/bench/kafka_send.json``.

    .venv/bin/python bench/gateway/kafka_send.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report import write

if TYPE_CHECKING:
    from contracts import ModelCallRecorded

GAPS_MS = (0.0, 2.0, 20.0)


def thread_cpu_ns() -> dict[str, int]:
    """CPU ns per thread kind of this process: the main thread (the event loop), librdkafka's threads by name, and
    the other Python threads (the producer's poll thread)."""
    out: dict[str, int] = {}
    me = str(os.getpid())
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
        kind = "loop" if task.name == me else ("librdkafka" if comm.startswith("rdk:") else "poll")
        out[kind] = out.get(kind, 0) + ns
    return out


async def measure(address: str, n: int, rounds: int) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer

    from contracts import encode, topics
    from eventbus import KafkaSettings, Producer
    from eventbus.admin import ensure_topics
    from eventbus.aio_consumer import aiokafka_config
    from gateway.settings import GatewaySettings

    settings = KafkaSettings(bootstrap_servers=address)
    await ensure_topics(settings, [topics.MODEL_CALLS])
    records = [sample_record(i) for i in range(16)]
    linger = GatewaySettings.model_fields["record_linger_ms"].default
    floe = Producer(settings, config={"linger.ms": linger})  # the gateway's producer settings
    await floe.start()
    aio = AIOKafkaProducer(
        acks="all", enable_idempotence=True, linger_ms=linger, compression_type="lz4", **aiokafka_config(settings)
    )
    await aio.start()

    async def idle(_: ModelCallRecorded) -> None:
        return None

    async def send_floe(r: ModelCallRecorded) -> None:
        await floe.send(topics.MODEL_CALLS, r)

    async def send_aio(r: ModelCallRecorded) -> None:
        await aio.send_and_wait(topics.MODEL_CALLS.name, encode(r), key=r.session_id.encode())

    columns: dict[str, Callable[[ModelCallRecorded], Awaitable[None]]] = {
        "idle": idle,
        "eventbus": send_floe,
        "aiokafka": send_aio,
    }
    figures: dict[str, Any] = {}
    try:
        for send in columns.values():  # connections, producer ids, metadata
            for r in records[:4]:
                await send(r)
        for gap_ms in GAPS_MS:
            per_round: dict[str, list[float]] = {c: [] for c in columns}
            threads: dict[str, int] = {}
            names = list(columns)
            for k in range(rounds):
                for name in names[k % len(names) :] + names[: k % len(names)]:
                    send = columns[name]
                    before = thread_cpu_ns()
                    for i in range(n):
                        await send(records[i % len(records)])
                        if gap_ms:
                            await asyncio.sleep(gap_ms / 1000)
                    after = thread_cpu_ns()
                    per_round[name].append((sum(after.values()) - sum(before.values())) / n / 1e6)
                    if name == "eventbus":
                        for kind, ns in after.items():
                            threads[kind] = threads.get(kind, 0) + ns - before.get(kind, 0)
            med = {c: statistics.median(v) for c, v in per_round.items()}
            g = f"{gap_ms:g}ms"
            figures[f"idle_cpu_ms_gap_{g}"] = round(med["idle"], 4)
            for c in ("eventbus", "aiokafka"):
                figures[f"{c}_send_cpu_ms_gap_{g}"] = round(med[c] - med["idle"], 4)
            for kind in ("loop", "poll", "librdkafka"):
                figures[f"eventbus_{kind}_cpu_ms_gap_{g}"] = round(threads.get(kind, 0) / (n * rounds) / 1e6, 4)
    finally:
        await floe.close()
        await aio.stop()
    return figures


def sample_record(i: int) -> ModelCallRecorded:
    """A record shaped like a gateway's (a 16-token answer to a short chat prompt, delta-encoded)."""
    from contracts import CallTimings, ModelCallRecorded, Protocol, TokenizationMode

    return ModelCallRecorded(
        session_id=f"bench-{i % 4}",
        group_id="bench",
        call_index=i,
        call_id=f"{i:024x}",
        protocol=Protocol.OPENAI_CHAT,
        tokenization=TokenizationMode.CANONICAL,
        model="policy",
        engine_id="http://127.0.0.1:8000",
        weight_version=0,
        prompt_token_ids=list(range(100, 121)),
        prefix_call_index=None,
        prefix_len=0,
        prompt_len=21,
        completion_token_ids=list(range(2000, 2016)),
        completion_logprobs=[-0.5 - j / 100 for j in range(16)],
        finish_reason="length",
        prefix_extends_previous=None,
        request={"model": "policy", "messages": [{"role": "user", "content": "write a haiku about kafka"}]},
        sampling={"temperature": 1.0, "top_p": 1.0, "seed": 3, "max_tokens": 16},
        timings=CallTimings(queue_ms=1.0, ttft_ms=30.0, total_ms=32.0),
        started_at=1796683672205,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sends (about a minute)")
    args = parser.parse_args()
    n, rounds = (30, 3) if args.quick else (60, 6)
    from eventbus.broker import LocalBroker, free_ports

    scratch = Path(tempfile.mkdtemp(prefix="floe-bench-kafka-send-"))
    broker = LocalBroker.at(scratch / "kafka")
    address = broker.start(*free_ports(2), owner_pid=os.getpid())
    cpus = sorted(os.sched_getaffinity(0))
    try:
        if len(cpus) > 1:  # this process alone on the last core, the broker on the others
            os.sched_setaffinity(0, {cpus[-1]})  # threads started from here on inherit it
            broker_pid = broker.pid()
            if broker_pid is not None:
                for task in Path(f"/proc/{broker_pid}/task").iterdir():
                    try:
                        os.sched_setaffinity(int(task.name), set(cpus[:-1]))
                    except (ProcessLookupError, FileNotFoundError):
                        continue
        try:
            import uvloop

            figures = uvloop.run(measure(address, n, rounds))
        except ImportError:
            figures = asyncio.run(measure(address, n, rounds))
    finally:
        broker.stop()
    print("\nCPU per acknowledged send (ms, all threads of the sending process, above the idle column)")
    print(f"{'gap between sends':20}{'idle only':>12}{'eventbus':>12}{'aiokafka':>12}{'aiokafka/eventbus':>20}")
    for gap_ms in GAPS_MS:
        g = f"{gap_ms:g}ms"
        e, a = figures[f"eventbus_send_cpu_ms_gap_{g}"], figures[f"aiokafka_send_cpu_ms_gap_{g}"]
        ratio = a / e if e > 0 else float("nan")
        print(f"{g:20}{figures[f'idle_cpu_ms_gap_{g}']:12.3f}{e:12.3f}{a:12.3f}{ratio:20.2f}")
    print("eventbus's CPU per send by thread (ms; the loop's share includes the idle column's):")
    for gap_ms in GAPS_MS:
        g = f"{gap_ms:g}ms"
        split = ", ".join(f"{k} {figures[f'eventbus_{k}_cpu_ms_gap_{g}']:.3f}" for k in ("loop", "poll", "librdkafka"))
        print(f"  gap {g}: {split}")
    figures.update(sends_per_round=n, rounds=rounds)
    write("kafka_send", figures)


if __name__ == "__main__":
    main()
