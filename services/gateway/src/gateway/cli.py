"""``floe gateway …`` subcommands.

    floe gateway serve                      run the gateway (settings from FLOE_GATEWAY_* and FLOE_KAFKA_*)
    floe gateway session-token ID [--url U] mint a session on a running gateway (needs FLOE_GATEWAY_CONTROL_TOKEN)

``python -m gateway`` is ``floe gateway serve``: the proxy alone. A gateway node (proxy + session runner) is
``python -m sessions``; session *runs* live in ``floe session …`` (both in ``services/sessions``).
"""

from __future__ import annotations

import argparse
import json
import sys

import structlog

from eventbus.entrypoint import BROKER, Flag, http_flags, list_flag, parse_service_args

__all__ = ["gateway_flags", "main", "serve"]


def gateway_flags() -> list[Flag]:
    """The flags of a gateway (``python -m gateway``) and of a gateway node (``python -m sessions``)."""
    return [
        *http_flags("FLOE_GATEWAY_"),
        BROKER,
        list_flag("--engine-url", "FLOE_GATEWAY_ENGINE_URLS", "an inference engine's base URL", "URL"),
    ]


def serve(argv: list[str] | None = None, prog: str = "python -m gateway") -> int:
    parse_service_args(
        prog,
        "Serve floe's model-API gateway alone (no session runner; that is `python -m sessions`). Settings: "
        "FLOE_GATEWAY_* and FLOE_KAFKA_*; the flags override them.",
        gateway_flags(),
        argv,
    )
    from eventbus import configure_logging
    from eventbus import serve as serve_app
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    settings = GatewaySettings()
    configure_logging("gateway", settings.log_level)
    if settings.run_sessions:
        # Deprecated spelling of "run a gateway node". The gateway does not import the runner (services never import
        # each other), so hand the process over to the node's entry point, which reads the same settings.
        import os

        structlog.get_logger().warning(
            "deprecated_setting", name="FLOE_GATEWAY_RUN_SESSIONS", use="python -m sessions (floe serve sessions)"
        )
        os.execv(sys.executable, [sys.executable, "-m", "sessions"])
    # Exits 1 if the session node (when this node runs sessions) dies, so a supervisor restarts it.
    return serve_app(create_app(settings), settings.host, settings.port, freeze_heap=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:], prog="floe gateway serve")
    parser = argparse.ArgumentParser(prog="floe gateway", description="the floe model-API gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the gateway")
    tok = sub.add_parser("session-token", help="create a session on a running gateway and print its credentials")
    tok.add_argument("session_id")
    tok.add_argument("--url", default=None, help="gateway URL (default: http://{host}:{port} from settings)")
    tok.add_argument("--tokenization", choices=["exact", "canonical"], default=None)
    tok.add_argument("--model", default="floe-policy")
    args = parser.parse_args(argv)
    import httpx

    from gateway.settings import GatewaySettings

    settings = GatewaySettings()
    if settings.control_token is None:
        print("set FLOE_GATEWAY_CONTROL_TOKEN to the gateway's control token", file=sys.stderr)
        return 2
    body = {"session_id": args.session_id, "model": args.model}
    if args.tokenization:
        body["tokenization"] = args.tokenization
    r = httpx.post(
        (args.url or settings.base_url()) + "/admin/sessions",
        json=body,
        headers={"authorization": f"Bearer {settings.control_token.get_secret_value()}"},
    )
    if r.status_code != 200:
        print(f"gateway answered {r.status_code}: {r.text}", file=sys.stderr)
        return 1
    print(json.dumps(r.json(), indent=2))
    return 0
