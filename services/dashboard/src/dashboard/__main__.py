"""``python -m dashboard``: serve the dashboard."""

from __future__ import annotations

import uvicorn

from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from eventbus import KafkaSettings, configure_logging
from eventbus.entrypoint import BROKER, Flag, http_flags, parse_service_args


def main(argv: list[str] | None = None) -> None:
    parse_service_args(
        "python -m dashboard",
        "Serve the dashboard (reads the topics, writes nothing). Settings: FLOE_DASHBOARD_* and FLOE_KAFKA_*; the "
        "flags override them.",
        [
            *http_flags("FLOE_DASHBOARD_"),
            BROKER,
            Flag("--kafka-client", "FLOE_DASHBOARD_KAFKA_CLIENT", "aiokafka (default) or confluent", metavar="NAME"),
        ],
        argv,
    )
    configure_logging("dashboard")
    settings = DashboardSettings()
    uvicorn.run(create_app(settings, KafkaSettings()), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
