"""``floe rollout …`` / ``floe export sft`` subcommands (the ``floe`` CLI forwards argv here).

- ``replay-rebuild --from OFFSET|TIME [--to …] --builder B --out DIR`` (Kafka), or ``--jsonl FILE`` (recorded events)
- ``export sft --out FILE [--dataset DIR] [--min-reward R] [--tokenizer PATH]``
- ``serve``: run the service (same as ``python -m rollout``)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from contracts import ADVANTAGE_METHODS

    p = argparse.ArgumentParser(prog="floe rollout", description="floe rollout service tools")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("replay-rebuild", help="rebuild trajectory batches from recorded model calls, offline")
    r.add_argument("--from", dest="start", help="first model-call offset or ISO-8601 time (Kafka input)")
    r.add_argument("--to", dest="end", help="end (exclusive) offset or ISO-8601 time (Kafka input)")
    r.add_argument("--jsonl", help="read recorded events from this JSONL file instead of Kafka")
    r.add_argument("--builder", default="prefix_merging", choices=["per_request", "prefix_merging"])
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--eot-token-ids", default="", help="comma-separated end-of-turn ids (default: auto-detect)")
    r.add_argument("--advantage", default="mean_std", choices=ADVANTAGE_METHODS)
    r.add_argument("--groups-per-batch", type=int, default=1)
    r.add_argument("--drop-zero-signal", action="store_true")
    r.add_argument("--topic-suffix", default="", help="read renamed topic copies (tests)")

    e = sub.add_parser("export", help="export the trajectory dataset")
    esub = e.add_subparsers(dest="format", required=True)
    sft = esub.add_parser("sft", help="accepted trajectories as chat-format JSONL")
    sft.add_argument("--out", required=True)
    sft.add_argument("--dataset", default=None, help="Parquet dataset dir (default: FLOE_ROLLOUT_DATASET_DIR)")
    sft.add_argument("--min-reward", type=float, default=1.0)
    sft.add_argument("--tokenizer", default=None, help="local tokenizer dir to decode the final answer")

    sub.add_parser("serve", help="run the rollout service")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "replay-rebuild":
            return _replay(args)
        if args.command == "export":
            return _export(args)
        from rollout.__main__ import main as serve

        return serve()
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _replay(args: argparse.Namespace) -> int:
    from rollout.replay import parse_bound, read_kafka, rebuild, write_result

    eot = [int(x) for x in args.eot_token_ids.split(",") if x.strip()] or None
    if args.jsonl:
        from rollout.replay import load_events_jsonl

        events = load_events_jsonl(args.jsonl)
    else:
        if args.start is None:
            raise ValueError("--from is required when reading from Kafka (or give --jsonl)")
        from eventbus import KafkaSettings
        from rollout.service import Topics

        topics = Topics.with_suffix(args.topic_suffix)
        start = parse_bound(args.start)
        end = parse_bound(args.end) if args.end else None
        events = asyncio.run(
            read_kafka(
                KafkaSettings(),
                [topics.requested, topics.finished, topics.calls, topics.rewards],
                topics.calls.name,
                start,
                end,
            )
        )
    result = rebuild(
        events,
        builder=args.builder,
        eot_token_ids=eot,
        advantage=args.advantage,
        groups_per_batch=args.groups_per_batch,
        drop_zero_signal_groups=args.drop_zero_signal,
    )
    write_result(result, args.out)
    print(
        json.dumps(
            {
                "events": len(events),
                "batches": len(result.batches),
                "groups": len(result.groups),
                "out": args.out,
                **{k: v for k, v in result.stats.as_dict().items() if "." not in k},
            }
        )
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    from rollout.dataset import export_sft

    dataset = args.dataset
    if dataset is None:
        from rollout.settings import RolloutSettings

        dataset = RolloutSettings().dataset_dir
        if dataset is None:
            raise ValueError("no dataset directory: pass --dataset or set FLOE_ROLLOUT_DATASET_DIR")
    detok: Callable[[Sequence[int]], str] | None = None
    if args.tokenizer:
        from transformers import AutoTokenizer  # heavy: only when asked

        tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)

        def detok(ids: Sequence[int]) -> str:
            return str(tok.decode(list(ids), skip_special_tokens=True))

    counts = export_sft(dataset, args.out, min_reward=args.min_reward, detokenize=detok)
    print(json.dumps({"out": args.out, **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
