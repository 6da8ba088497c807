"""``python -m inference [--engine cpu|vllm] [--model DIR|NAME]``: serve floe's inference engine.

Settings come from ``FLOE_INFERENCE_*`` (and ``FLOE_KAFKA_*``); the flags override them (``--engine``,
``--model``, ``--host``, ``--port``, ``--broker``). ``--model`` takes a checkpoint directory or a name from
``floe model list``, which is fetched (or verified, if already cached) first. ``--engine vllm`` serves the same
host, port and model name through ``inference.vllm_proxy``, in front of a vLLM it starts (``deploy/vllm/serve.sh``)
or ``FLOE_INFERENCE_VLLM_URL``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["cpu", "vllm"], default=None, help="default: FLOE_INFERENCE_ENGINE or cpu")
    parser.add_argument("--model", default=None, help="checkpoint directory, or a model name of `floe model list`")
    from eventbus.entrypoint import BROKER, http_flags, parse_service_args

    args = parse_service_args(
        parser.prog, parser.description or "", [*http_flags("FLOE_INFERENCE_"), BROKER], argv, parser=parser
    )

    from eventbus import configure_logging
    from inference.settings import InferenceSettings

    configure_logging("inference")
    overrides: dict[str, Any] = {}
    if args.engine is not None:
        overrides["engine"] = args.engine
    if args.model is not None:
        overrides["model_dir"] = _resolve_model(args.model)
    settings = InferenceSettings(**overrides)
    from eventbus import serve

    if settings.engine == "vllm":
        from inference.vllm_engine import VllmLaunchError, check_model_dir, find_serve_script
        from inference.vllm_proxy import create_vllm_app

        try:  # the mistakes a user makes, said before anything starts
            check_model_dir(settings)
            if settings.vllm_url is None:
                find_serve_script(settings)
        except VllmLaunchError as exc:
            print(f"inference: {exc}", file=sys.stderr)
            return 2
        # Exits 1 if vLLM, the weight follower or the watch dies; uvicorn exits 3 if vLLM never became healthy.
        return serve(create_vllm_app(settings), settings.host, settings.port)

    from inference.app import create_app

    # Exits 1 if the weight reloader dies (see eventbus.serving), so a supervisor restarts the engine.
    return serve(create_app(settings), settings.host, settings.port)


def _resolve_model(model: str) -> Path:
    from inference.models import MODELS, ModelCacheError, fetch_model
    from inference.settings import CacheSettings

    if model not in MODELS:
        return Path(model)
    try:
        return fetch_model(model, CacheSettings().cache).path
    except ModelCacheError as exc:
        raise SystemExit(f"inference: {exc}") from exc


if __name__ == "__main__":
    sys.exit(main())
