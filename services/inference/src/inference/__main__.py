"""``python -m inference``: serve the engine with settings from ``FLOE_INFERENCE_*`` (and ``FLOE_KAFKA_*``)."""

from __future__ import annotations

import uvicorn

from eventbus import configure_logging
from inference.app import create_app
from inference.settings import InferenceSettings


def main() -> None:
    configure_logging("inference")
    settings = InferenceSettings()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
