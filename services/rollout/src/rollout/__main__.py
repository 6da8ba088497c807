"""``python -m rollout``: run the rollout service (HTTP /state and /metrics + the Kafka pipeline)."""

from __future__ import annotations

import sys

import uvicorn

from eventbus import KafkaSettings, configure_logging
from rollout.app import create_app
from rollout.settings import RolloutSettings


def main() -> int:
    settings = RolloutSettings()
    configure_logging("rollout", settings.log_level)
    app = create_app(settings, KafkaSettings())
    uvicorn.run(app, host=settings.http_host, port=settings.http_port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
