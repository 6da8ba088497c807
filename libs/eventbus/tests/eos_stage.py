"""A consume -> produce stage run as a real subprocess by test_exactly_once.py (not a test module).

Reads ``SessionFinished`` from --input and writes one ``RewardPublished`` per input to --output, exactly once, with
``TransactionalProcessor``. With ``--hang-at-txn N`` it flushes the N-th transaction's outputs (written to the log,
not committed), prints ``IN_TXN N`` and hangs, so the test can SIGKILL it mid-transaction. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from contracts import REWARDS, SESSIONS_FINISHED, Outcome, RewardPublished
from eventbus import KafkaSettings, TransactionalProcessor, configure_logging


async def run(args: argparse.Namespace) -> None:
    settings = KafkaSettings(bootstrap_servers=args.bootstrap)
    inp = SESSIONS_FINISHED.with_name(args.input)
    out = REWARDS.with_name(args.output)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    txns = 0
    async with TransactionalProcessor(
        settings, [inp], group_id=args.group, transactional_id=args.txn_id, max_batch=args.max_batch
    ) as tp:
        print("READY", flush=True)
        while not stop.is_set():
            # batches() returns after 0.5 s without input, so SIGTERM is noticed promptly.
            async for batch in tp.batches(timeout_s=0.5):
                for msg in batch:
                    ev = msg.event
                    reward = RewardPublished(
                        session_id=ev.session_id,
                        group_id=ev.group_id,
                        task_id=ev.task_id,
                        reward=1.0,
                        outcome=Outcome.RESOLVED,
                        resolved=True,
                        reason=f"from offset {msg.offset}",
                    )
                    tp.produce(out, reward)
                txns += 1
                if txns == args.hang_at_txn:
                    await tp.flush()
                    print(f"IN_TXN {txns} {len(batch)}", flush=True)
                    await asyncio.sleep(3600)  # the test SIGKILLs us here
                if not await tp.commit(batch):
                    print("ABORTED", flush=True)
                    continue
                print(f"COMMITTED {txns} {len(batch)}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--input", "--output", "--group", "--txn-id"):
        parser.add_argument(name, required=True)
    parser.add_argument("--max-batch", type=int, default=20)
    parser.add_argument("--hang-at-txn", type=int, default=0, help="flush, print IN_TXN and hang in this transaction")
    configure_logging("eos-stage", level="WARNING")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
