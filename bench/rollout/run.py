"""Trajectory builders side by side: per_request vs prefix_merging.

    .venv/bin/python bench/rollout/run.py                       # generated realistic multi-turn sessions
    .venv/bin/python bench/rollout/run.py --jsonl calls.jsonl   # recorded ModelCallRecorded events (any order)

Prints, per builder: samples (traces the trainer sees), trainer tokens (sum of sequence lengths: what a trainer
forward/backward pays for), trainable tokens (identical by construction: the same sampled tokens), masked tokens,
chains/breaks, and builder throughput (calls/s and trainer tokens/s, median of ``--repeat`` runs); then the ratios
per_request ÷ prefix_merging.

Generated sessions (``services/rollout/tests/simulate.py``, a test fixture) are synthetic: ChatML-like renders with a
Codex-sized system prompt, mostly tool-calling turns, rare truncated answers, compactions, sub-agents and history
rewrites. They are a stand-in until recordings through real harnesses exist; pass ``--jsonl`` to measure recordings
instead.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

# The session simulator is a fixture of the rollout's tests (services/rollout/tests/simulate.py), not service code.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "services" / "rollout" / "tests"))

from simulate import random_ops, simulate_session

from contracts import ModelCallRecorded, TokenizationMode
from rollout.builders import build_trajectories
from rollout.replay import load_events_jsonl
from rollout.trace import ReconstructionStats

BUILDERS = ("per_request", "prefix_merging")


def generated_sessions(
    n: int, seed: int, mode: TokenizationMode, turns: tuple[int, int]
) -> list[list[ModelCallRecorded]]:
    rng = random.Random(seed)
    sessions = []
    for i in range(n):
        ops = random_ops(rng, rng.randint(*turns))
        sessions.append(
            simulate_session(
                f"s{i}", ops, mode, rng, system_len=rng.randint(2000, 6000), task_len=rng.randint(100, 800)
            )
        )
    return sessions


def recorded_sessions(path: Path) -> list[list[ModelCallRecorded]]:
    by_session: dict[str, list[ModelCallRecorded]] = defaultdict(list)
    for event in load_events_jsonl(path):
        if isinstance(event, ModelCallRecorded):
            by_session[event.session_id].append(event)
    return [by_session[s] for s in sorted(by_session)]


def measure(sessions: list[list[ModelCallRecorded]], builder: str, repeat: int) -> dict[str, float]:
    stats = ReconstructionStats()
    samples = 0
    for calls in sessions:
        result = build_trajectories(calls, builder)
        stats.add(result.stats)
        samples += len(result.traces)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for calls in sessions:
            build_trajectories(calls, builder)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return {
        "samples": samples,
        "trainer_tokens": stats.total_tokens,
        "trainable_tokens": stats.trainable_tokens,
        "masked_tokens": stats.masked_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "chains": stats.chains,
        "breaks": stats.breaks,
        "calls": stats.calls,
        "seconds": seconds,
        "calls_per_s": stats.calls / seconds if seconds else float("inf"),
        "trainer_tokens_per_s": stats.total_tokens / seconds if seconds else float("inf"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jsonl", type=Path, help="recorded ModelCallRecorded events (JSONL)")
    p.add_argument("--sessions", type=int, default=40)
    p.add_argument("--turns", type=int, nargs=2, default=(15, 80), metavar=("MIN", "MAX"))
    p.add_argument("--mode", choices=[m.value for m in TokenizationMode], default="exact")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args(argv)

    if args.jsonl:
        sessions = recorded_sessions(args.jsonl)
        source = f"recorded: {args.jsonl}"
    else:
        sessions = generated_sessions(args.sessions, args.seed, TokenizationMode(args.mode), tuple(args.turns))
        source = f"generated: {args.sessions} sessions, {args.turns[0]}-{args.turns[1]} turns, {args.mode} mode"
    if not sessions:
        print("no sessions", file=sys.stderr)
        return 1
    results = {b: measure(sessions, b, args.repeat) for b in BUILDERS}
    pr, pm = results["per_request"], results["prefix_merging"]
    ratios = {
        "samples": pr["samples"] / pm["samples"],
        "trainer_tokens": pr["trainer_tokens"] / pm["trainer_tokens"],
        "builder_seconds": pr["seconds"] / pm["seconds"],
    }
    if args.json:
        print(json.dumps({"source": source, "results": results, "ratios": ratios}, indent=2))
        return 0
    print(f"# {source}; {pr['calls']} calls in {len(sessions)} sessions")
    print(f"{'':24}{'per_request':>16}{'prefix_merging':>16}{'ratio pr/pm':>14}")
    rows = [
        ("samples (traces)", "samples", "{:,.0f}"),
        ("trainer tokens", "trainer_tokens", "{:,.0f}"),
        ("trainable tokens", "trainable_tokens", "{:,.0f}"),
        ("masked tokens", "masked_tokens", "{:,.0f}"),
        ("chains / breaks", None, ""),
        ("builder calls/s", "calls_per_s", "{:,.0f}"),
        ("builder trainer tok/s", "trainer_tokens_per_s", "{:,.0f}"),
    ]
    for label, key, fmt in rows:
        if key is None:
            a, b = f"{pr['chains']:,}/{pr['breaks']}", f"{pm['chains']:,}/{pm['breaks']}"
            print(f"{label:24}{a:>16}{b:>16}")
            continue
        ratio = pr[key] / pm[key] if pm[key] else float("nan")
        print(f"{label:24}{fmt.format(pr[key]):>16}{fmt.format(pm[key]):>16}{ratio:>13.2f}x")
    print(
        f"# Polar (paper, second-hand): 1,185 -> 218 trainer updates = {1185 / 218:.2f}x fewer samples; "
        f"here {ratios['samples']:.2f}x fewer samples and {ratios['trainer_tokens']:.2f}x fewer trainer tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
