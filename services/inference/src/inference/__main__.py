"""``python -m inference``: serve the engine with settings from ``FLOE_INFERENCE_*`` (and ``FLOE_KAFKA_*``)."""

from __future__ import annotations

import sys

from eventbus import configure_logging, serve
from inference.app import create_app
from inference.settings import InferenceSettings


def main() -> int:
    configure_logging("inference")
    settings = InferenceSettings()
    # Exits 1 if the weight reloader dies (see eventbus.serving), so a supervisor restarts the engine.
    return serve(create_app(settings), settings.host, settings.port)


if __name__ == "__main__":
    sys.exit(main())
