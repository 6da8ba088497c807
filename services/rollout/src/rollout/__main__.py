"""``python -m rollout``: run the rollout service (HTTP /state and /metrics + the Kafka pipeline).

Exits 1 if the pipeline dies (see ``eventbus.serving``), so a supervisor restarts it."""

from __future__ import annotations

import sys

from eventbus import KafkaSettings, configure_logging, serve
from rollout.app import create_app
from rollout.settings import RolloutSettings


def main() -> int:
    settings = RolloutSettings()
    configure_logging("rollout", settings.log_level)
    return serve(create_app(settings, KafkaSettings()), settings.http_host, settings.http_port)


if __name__ == "__main__":
    sys.exit(main())
