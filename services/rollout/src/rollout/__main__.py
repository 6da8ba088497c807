"""``python -m rollout``: run the rollout service (HTTP /state and /metrics + the Kafka pipeline).

Exits 1 if the pipeline dies (see ``eventbus.serving``), so a supervisor restarts it."""

from __future__ import annotations

import sys

from eventbus import KafkaSettings, configure_logging, serve
from eventbus.entrypoint import BROKER, http_flags, parse_service_args
from rollout.app import create_app
from rollout.settings import RolloutSettings


def main(argv: list[str] | None = None) -> int:
    parse_service_args(
        "python -m rollout",
        "Run the rollout service: GRPO groups, trajectories and batches (HTTP /state and /metrics). Settings: "
        "FLOE_ROLLOUT_* and FLOE_KAFKA_*; the flags override them.",
        [*http_flags("FLOE_ROLLOUT_", "HTTP_HOST", "HTTP_PORT"), BROKER],
        argv,
    )
    settings = RolloutSettings()
    configure_logging("rollout", settings.log_level)
    return serve(create_app(settings, KafkaSettings()), settings.http_host, settings.http_port)


if __name__ == "__main__":
    sys.exit(main())
