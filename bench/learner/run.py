"""Learner benchmark: training wall-clock on the same sessions built ``per_request`` vs ``prefix_merging``, on CPU.

The same synthetic multi-turn agent sessions (the learner tests' ``services/learner/tests/synthetic.py``: every
call's prompt extends the previous call's prompt + completion + tool output, as a real agent's does) are turned into
the two batch forms of polar.md §3.2 / §3.3 — one row per call with its full prompt, or one merged row per session
whose tool/template tokens are masked — and the real ``Learner.step`` trains on each (same model, same settings,
fresh checkpoint dir). Both forms carry exactly the same trainable tokens; per_request re-processes every growing
prefix.

Prints tokens processed, trainable tokens, wall-clock per step and the ratio. Default: a small Qwen2-style model
(hidden 128, 4 layers, vocab 512), 4 groups x 4 sessions x 8 turns, 3 measured steps per form after a warm-up.

    .venv/bin/python bench/learner/run.py [--turns 8] [--steps 3] [--threads 2] [--quick]

``--recordings DIR`` trains instead on recorded harness sessions (``bench/recordings``: real CLIs through the real
gateway): each session is rebuilt by ``rollout.builders`` (``per_request`` and ``prefix_merging``), turned into
``contracts.TrajectoryRow`` rows (advantage +1/-1 alternating by session, session_weight 1/num_traces), and the
learner trains on all selected sessions in one batch per form. The model uses the recordings' vocabulary (the dev
tokenizer, 2048). Default selection ``--harness pi --mode exact`` keeps the run under ~3 minutes on 2 shared cores
(Codex's 16k and Claude Code's ~50k-token prompts make a per_request step take many minutes on CPU; select them
explicitly).

    .venv/bin/python bench/learner/run.py --recordings bench/recordings/data [--harness pi codex] [--mode exact]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# The synthetic sessions and tiny model are the learner tests' fixture (services/learner/tests/synthetic.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "services" / "learner" / "tests"))

from synthetic import per_request_rows, prefix_merging_rows, save_tiny_model, synthetic_sessions

from contracts import TrajectoryRow, to_ipc
from eventbus import configure_logging
from learner import Learner, LearnerSettings

RECORDED_VOCAB = 2048  # the dev tokenizer's (``floe inference init-model``), which the recordings use


def recorded_rows(sessions: list[list[Any]], builder: str, harness: str) -> list[TrajectoryRow]:
    """Trajectory rows of recorded sessions rebuilt by ``rollout.builders`` (the rollout's own builders)."""
    from rollout.builders import build_trajectories

    rows: list[TrajectoryRow] = []
    for i, calls in enumerate(sessions):
        traces = build_trajectories(calls, builder).traces
        advantage = 1.0 if i % 2 == 0 else -1.0
        sid = calls[0].session_id
        for j, t in enumerate(traces):
            rows.append(
                TrajectoryRow(
                    session_id=sid,
                    group_id=f"{harness}-group",
                    task_id=f"{harness}-task",
                    harness=harness,
                    builder=builder,
                    trace_index=j,
                    num_traces=len(traces),
                    prompt_len=t.prompt_len,
                    tokens=t.tokens,
                    loss_mask=t.loss_mask,
                    logprobs=t.logprobs,
                    weight_versions=t.weight_versions,
                    reward=max(advantage, 0.0),
                    advantage=advantage,
                    session_weight=1.0 / len(traces),
                    status="DONE",
                )
            )
    return rows


def run_recorded(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recordings"))
    from load import load_recordings

    recs = load_recordings(args.recordings)
    chosen = {k: v for k, v in recs.items() if k[0] in args.harness and k[1] in args.mode}
    if not chosen:
        raise SystemExit(f"no recordings for harness {args.harness} / mode {args.mode} in {args.recordings}")
    batches = {
        form: to_ipc([row for (h, _m), sess in chosen.items() for row in recorded_rows(sess, form, h)])
        for form in ("per_request", "prefix_merging")
    }
    # Warm-up (allocator, kernels) on one small pi-sized row, so the measured steps compare the two forms only.
    first = next(iter(chosen.items()))
    warm = to_ipc(recorded_rows(first[1][:1], "prefix_merging", first[0][0])[:1])
    results = {}
    with tempfile.TemporaryDirectory(prefix="floe-bench-learner-") as tmp:
        root = Path(tmp)
        model_dir = save_tiny_model(
            root / "model",
            vocab_size=RECORDED_VOCAB,
            num_heads=4,
            num_kv_heads=2,
            hidden_size=args.hidden,
            num_layers=args.layers,
            intermediate_size=3 * args.hidden,
        )
        for form, data in batches.items():
            settings = LearnerSettings(
                model_dir=model_dir,
                checkpoint_dir=root / form,
                lr=1e-5,
                kl_coef=0.0,
                micro_batch_tokens=args.micro_batch_tokens,
                max_seq_len=args.max_seq_len,
            )
            learner = Learner(settings)
            learner.step(f"{form}-warmup", warm)
            times, tokens, trainable, mbs = [], 0.0, 0.0, 0.0
            for i in range(args.steps):
                t0 = time.perf_counter()
                res = learner.step(f"{form}-{i}", data)
                times.append(time.perf_counter() - t0)
                tokens += res.metrics["tokens_total"]
                trainable += res.metrics["tokens_trainable"]
                mbs += res.metrics["micro_batches"]
            results[form] = (statistics.mean(times), tokens / len(times), trainable / len(times), mbs / len(times))
    pr, pm = results["per_request"], results["prefix_merging"]
    n_sessions = sum(len(v) for v in chosen.values())
    n_calls = sum(len(s) for v in chosen.values() for s in v)
    print(f"\nlearner on recordings {sorted(chosen)}: {n_sessions} sessions, {n_calls} calls; model hidden "
          f"{args.hidden} x {args.layers} layers, vocab {RECORDED_VOCAB}; {args.steps} step(s), "
          f"CPU threads={args.threads}")  # fmt: skip
    print(f"{'form':<16}{'s/step':>10}{'tokens/step':>14}{'trainable':>12}{'micro-b.':>10}{'tokens/s':>12}")
    for form, (t, tok, tr, mb) in results.items():
        print(f"{form:<16}{t:>10.3f}{tok:>14.0f}{tr:>12.0f}{mb:>10.1f}{tok / t:>12.0f}")
    print(f"prefix_merging speed-up (wall-clock per step): {pr[0] / pm[0]:.2f}x; "
          f"tokens processed: {pr[1] / pm[1]:.2f}x fewer; same trainable tokens: {pr[2] == pm[2]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="measured steps per form (3; 1 with --recordings)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="tiny model and 4 turns, for a smoke run")
    parser.add_argument("--recordings", type=Path, help="train on recorded sessions in DIR (bench/recordings/data)")
    parser.add_argument("--harness", nargs="+", default=["pi"], help="with --recordings")
    parser.add_argument(
        "--mode", nargs="+", default=["exact"], choices=["exact", "canonical"], help="with --recordings"
    )
    parser.add_argument("--hidden", type=int, default=128, help="with --recordings: model width")
    parser.add_argument("--layers", type=int, default=4, help="with --recordings: model depth")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768, help="with --recordings")
    parser.add_argument("--max-seq-len", type=int, default=65536, help="with --recordings")
    args = parser.parse_args()
    configure_logging("bench-learner", level="WARNING")
    torch.set_num_threads(args.threads)
    if args.recordings:
        args.steps = args.steps or 1
        if args.quick:
            args.steps, args.hidden, args.layers, args.harness = 1, 32, 2, ["pi"]
        run_recorded(args)
        return
    args.steps = args.steps or 3
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
