"""``floe inference …`` subcommands: ``init-model`` (create the tiny dev checkpoint) and ``serve``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floe inference", description="floe CPU inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init-model", help="create the tiny development model (deterministic)")
    init.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    init.add_argument("--hidden-size", type=int, default=64)
    init.add_argument("--layers", type=int, default=2)
    init.add_argument("--heads", type=int, default=4)
    init.add_argument("--kv-heads", type=int, default=2)
    init.add_argument("--intermediate-size", type=int, default=192)
    init.add_argument("--vocab-size", type=int, default=2048)
    init.add_argument("--max-positions", type=int, default=32768)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--version", type=int, default=0, help="weight version recorded in floe.json")
    serve_cmd = sub.add_parser("serve", help="run the server (settings from FLOE_INFERENCE_* env)", add_help=False)
    serve_cmd.add_argument("serve_args", nargs=argparse.REMAINDER, help="--engine cpu|vllm, --model DIR|NAME")
    args = parser.parse_args(argv)

    if args.command == "init-model":
        from inference.checkpoint import DevModelSpec, init_dev_model

        spec = DevModelSpec(
            hidden_size=args.hidden_size,
            intermediate_size=args.intermediate_size,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            max_position_embeddings=args.max_positions,
            vocab_size=args.vocab_size,
            seed=args.seed,
        )
        out = init_dev_model(args.out, spec, version=args.version)
        print(json.dumps({"path": str(out), "version": args.version, "spec": spec.__dict__}))
        return 0
    from inference.__main__ import main as serve

    return serve(args.serve_args)
