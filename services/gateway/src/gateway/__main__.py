"""``python -m gateway``: serve the gateway with settings from ``FLOE_GATEWAY_*`` (and ``FLOE_KAFKA_*``)."""

from __future__ import annotations

import sys

from gateway.cli import serve

if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1:]))
