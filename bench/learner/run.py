"""Learner benchmark: training wall-clock on the same sessions built ``per_request`` vs ``prefix_merging``, on CPU.

The same synthetic multi-turn agent sessions (``learner.synthetic``: every call's prompt extends the previous
call's prompt + completion + tool output, as a real agent's does) are turned into the two batch forms of
polar.md §3.2 / §3.3 — one row per call with its full prompt, or one merged row per session whose tool/template
tokens are masked — and the real ``Learner.step`` trains on each (same model, same settings, fresh checkpoint
dir). Both forms carry exactly the same trainable tokens; per_request re-processes every growing prefix.

Prints tokens processed, trainable tokens, wall-clock per step and the ratio. Default: a small Qwen2-style model
(hidden 128, 4 layers, vocab 512), 4 groups x 4 sessions x 8 turns, 3 measured steps per form after a warm-up.

    .venv/bin/python bench/learner/run.py [--turns 8] [--steps 3] [--threads 2] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from contracts import to_ipc
from eventbus import configure_logging
from learner import Learner, LearnerSettings
from learner.synthetic import per_request_rows, prefix_merging_rows, save_tiny_model, synthetic_sessions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="tiny model and 4 turns, for a smoke run")
    args = parser.parse_args()
    configure_logging("bench-learner", level="WARNING")
    torch.set_num_threads(args.threads)
    if args.quick:
        args.turns, args.steps, args.groups = 4, 1, 2
    vocab = 512
    with tempfile.TemporaryDirectory(prefix="floe-bench-learner-") as tmp:
        root = Path(tmp)
        size = (
            dict(hidden_size=32, num_layers=2, intermediate_size=64)
            if args.quick
            else dict(hidden_size=128, num_layers=4, intermediate_size=384)
        )
        model_dir = save_tiny_model(root / "model", vocab_size=vocab, num_heads=4, num_kv_heads=2, **size)
        rng = random.Random(0)
        sessions = [
            synthetic_sessions(args.groups, args.group_size, args.turns, rng, vocab_size=vocab)
            for _ in range(args.steps + 1)
        ]
        results = {}
        for form, build in (("per_request", per_request_rows), ("prefix_merging", prefix_merging_rows)):
            settings = LearnerSettings(
                model_dir=model_dir, checkpoint_dir=root / form, lr=1e-5, kl_coef=0.0, micro_batch_tokens=8192
            )
            learner = Learner(settings)
            batches = [to_ipc(build(s)) for s in sessions]
            learner.step(f"{form}-warmup", batches[0])
            times, tokens, trainable, mbs = [], 0.0, 0.0, 0.0
            for i, data in enumerate(batches[1:]):
                t0 = time.perf_counter()
                res = learner.step(f"{form}-{i}", data)
                times.append(time.perf_counter() - t0)
                tokens += res.metrics["tokens_total"]
                trainable += res.metrics["tokens_trainable"]
                mbs += res.metrics["micro_batches"]
            results[form] = (statistics.mean(times), tokens / len(times), trainable / len(times), mbs / len(times))

    pr, pm = results["per_request"], results["prefix_merging"]
    print(f"\nlearner: {args.groups} groups x {args.group_size} sessions x {args.turns} turns, "
          f"{args.steps} step(s), CPU threads={args.threads}")  # fmt: skip
    print(f"{'form':<16}{'s/step':>10}{'tokens/step':>14}{'trainable':>12}{'micro-b.':>10}{'tokens/s':>12}")
    for form, (t, tok, tr, mb) in results.items():
        print(f"{form:<16}{t:>10.3f}{tok:>14.0f}{tr:>12.0f}{mb:>10.1f}{tok / t:>12.0f}")
    print(f"prefix_merging speed-up (wall-clock per step): {pr[0] / pm[0]:.2f}x; "
          f"tokens processed: {pr[1] / pm[1]:.2f}x fewer; same trainable tokens: {pr[2] == pm[2]}")  # fmt: skip


if __name__ == "__main__":
    main()
