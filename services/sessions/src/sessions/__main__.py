"""``python -m sessions``: run a gateway node (the proxy and the session runner in one process).

Settings: ``FLOE_GATEWAY_*`` (the proxy), ``FLOE_GATEWAY_SESSIONS_*`` (the runner), ``FLOE_KAFKA_*``.
"""

from __future__ import annotations

import sys

from sessions.gateway_node import serve

if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1:]))
