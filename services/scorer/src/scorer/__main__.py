"""``python -m scorer``: run the scorer service until SIGINT/SIGTERM.

Startup: build the grader (probe isolation; refuse to run unsandboxed unless FLOE_SCORER_ALLOW_UNSANDBOXED=1),
validate the default task set when ``FLOE_SCORER_VALIDATE_ON_START`` (cached by digest), then consume.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import structlog

from eventbus import KafkaSettings, configure_logging
from eventbus.entrypoint import BROKER, Flag, parse_service_args
from scorer.errors import ScorerError
from scorer.factory import load_taskset, make_grader
from scorer.service import ScorerService
from scorer.settings import ScorerSettings
from scorer.validation import validate_taskset


async def _main() -> int:
    configure_logging("scorer")
    log = structlog.get_logger()
    settings = ScorerSettings()
    try:
        grader, _probe = make_grader(settings)
    except ScorerError as exc:
        log.error("scorer cannot start", error=str(exc))
        return 2
    invalid: dict[str, set[str]] = {}
    if settings.validate_on_start:
        taskset = load_taskset(settings.task_source)
        rows = await asyncio.to_thread(
            validate_taskset, taskset, grader, workers=settings.workers, cache_dir=settings.work_dir
        )
        invalid[settings.task_source] = {r.instance_id for r in rows if not r.ok}
        log.info("task set validated", tasks=len(rows), invalid=sorted(invalid[settings.task_source]))
    service = ScorerService(
        grader,
        KafkaSettings(),
        workers=settings.workers,
        group_id=settings.consumer_group,
        transactional_id=settings.transactional_id or f"scorer-{os.uname().nodename}",
        invalid_tasks=invalid,
    )
    task = asyncio.create_task(service.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        log.info("scorer stopped", scored=service.scored)
    return 0


def main(argv: list[str] | None = None) -> int:
    parse_service_args(
        "python -m scorer",
        "Run the scorer service: grade each finished session's diff in a sandbox and publish its reward. Settings: "
        "FLOE_SCORER_* and FLOE_KAFKA_*; the flags override them.",
        [
            BROKER,
            Flag("--task-source", "FLOE_SCORER_TASK_SOURCE", "'bundled' or a SWE-bench JSONL file", metavar="SOURCE"),
            Flag("--workers", "FLOE_SCORER_WORKERS", "concurrent graders", type=int, metavar="N"),
            Flag("--backend", "FLOE_SCORER_BACKEND", "sandbox: bwrap, docker or bare", metavar="NAME"),
            Flag(
                "--docker-namespace",
                "FLOE_SCORER_DOCKER_NAMESPACE",
                "docker backend's images: swebench (official) or floe (floe score images)",
                metavar="NS",
            ),
        ],
        argv,
    )
    return asyncio.run(_main())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
