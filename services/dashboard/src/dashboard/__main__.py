"""``python -m dashboard``: serve the dashboard."""

from __future__ import annotations

import uvicorn

from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from eventbus import KafkaSettings, configure_logging


def main() -> None:
    configure_logging("dashboard")
    settings = DashboardSettings()
    uvicorn.run(create_app(settings, KafkaSettings()), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
