"""``floe learner …`` / ``python -m learner …``: run the learner service, or train offline on Arrow files.

- ``serve`` (the default): consume ``floe.trajectory-batches``, train, checkpoint, publish ``floe.weights``.
  Settings come from ``FLOE_LEARNER_*`` (``MODEL_DIR`` and ``CHECKPOINT_DIR`` are required) and Kafka from
  ``FLOE_KAFKA_*``. Multi-GPU: ``torchrun --nproc_per_node N -m learner``.
- ``train-files FILE…``: apply Arrow IPC batch files in order (batch id = file name stem) without Kafka; prints
  one JSON line of metrics per step on rank 0. ``--model-dir`` / ``--checkpoint-dir`` override the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from learner.settings import LearnerSettings

__all__ = ["main"]


def _serve_args(argv: list[str]) -> None:
    from eventbus.entrypoint import BROKER, Flag, parse_service_args

    parse_service_args(
        "python -m learner [serve]",
        "Run the learner service: consume trajectory batches, train, checkpoint, publish weights. Settings: "
        "FLOE_LEARNER_* (MODEL_DIR and CHECKPOINT_DIR are required) and FLOE_KAFKA_*; the flags override them.",
        [
            BROKER,
            Flag("--model-dir", "FLOE_LEARNER_MODEL_DIR", "base model directory (version 0)", metavar="DIR"),
            Flag("--checkpoint-dir", "FLOE_LEARNER_CHECKPOINT_DIR", "where versions are written", metavar="DIR"),
            Flag("--device", "FLOE_LEARNER_DEVICE", "torch device (cpu, cuda)", metavar="DEV"),
        ],
        argv,
    )


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] == "serve" or (argv[0].startswith("--") and argv[0] not in ("--help", "-h")):
        _serve_args(argv[1:] if argv[:1] == ["serve"] else argv)
        argv = ["serve"]
    parser = argparse.ArgumentParser(prog="floe learner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="consume trajectory batches from Kafka and publish weights (default)")
    files = sub.add_parser("train-files", help="train on Arrow IPC batch files, no Kafka")
    files.add_argument("files", nargs="+", type=Path)
    files.add_argument("--model-dir", type=Path)
    files.add_argument("--checkpoint-dir", type=Path)
    args = parser.parse_args(argv)

    from eventbus import configure_logging
    from learner.settings import LearnerSettings

    configure_logging("learner")
    if args.command == "train-files":
        from learner.distributed import init_distributed, shutdown
        from learner.train import train_files

        overrides: dict[str, Any] = {}
        if args.model_dir:
            overrides["model_dir"] = args.model_dir
        if args.checkpoint_dir:
            overrides["checkpoint_dir"] = args.checkpoint_dir
        settings = LearnerSettings(**overrides)
        info = init_distributed(settings.device)
        try:
            for result in train_files(settings, args.files, info):
                if info.is_main:
                    print(json.dumps({"batch_id": result.batch_id, "version": result.version, **result.metrics}))
        finally:
            shutdown()
        return 0
    return asyncio.run(_serve(LearnerSettings()))  # type: ignore[call-arg]


async def _serve(settings: LearnerSettings) -> int:
    from learner.distributed import shutdown
    from learner.train import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(settings, stop)
    finally:
        shutdown()
    return 0
