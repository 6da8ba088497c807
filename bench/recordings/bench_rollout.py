"""Trajectory builders on the recorded harness sessions: per_request vs prefix_merging, per harness and mode.

    .venv/bin/python bench/recordings/bench_rollout.py [--dir bench/recordings/data] [--repeat 3]

For every recording (``<harness>.<mode>``) prints, side by side: samples (traces) per_request ÷ prefix_merging,
trainer tokens (sum of trace lengths) per_request ÷ prefix_merging, the trainable-token fraction of each (sampled
tokens ÷ trainer tokens), prefix_merging's chains and chain breaks (also per 100 calls, with the reasons ``rollout``
reports), and each builder's throughput (trainer tokens built per second, median of
``--repeat`` runs). ``bench/rollout/run.py --jsonl`` measures one plain JSONL file; this script reads the gzipped
recordings directly and breaks the numbers down per harness.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import DATA, load_recordings

from contracts import ModelCallRecorded
from rollout.builders import build_trajectories

BUILDERS = ("per_request", "prefix_merging")


@dataclass
class Measured:
    samples: int = 0
    tokens: int = 0
    trainable: int = 0
    chains: int = 0
    breaks: int = 0
    calls: int = 0
    seconds: float = 0.0
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def trainable_frac(self) -> float:
        return self.trainable / self.tokens if self.tokens else 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("inf")


def measure(sessions: list[list[ModelCallRecorded]], builder: str, repeat: int) -> Measured:
    m = Measured()
    for s in sessions:
        r = build_trajectories(s, builder)
        m.samples += len(r.traces)
        m.tokens += r.stats.total_tokens
        m.trainable += r.stats.trainable_tokens
        m.breaks += r.stats.breaks
        m.chains += r.stats.chains
        m.calls += r.stats.calls
        m.reasons.update(r.stats.break_reasons)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s in sessions:
            build_trajectories(s, builder)
        times.append(time.perf_counter() - t0)
    m.seconds = statistics.median(times)
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dir", type=Path, default=DATA)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    recs = load_recordings(args.dir)
    print(
        f"{'recording':24}{'sess':>5}{'calls':>6}{'samples pr/pm':>15}{'ratio':>7}{'trainer tok pr/pm':>21}"
        f"{'ratio':>7}{'trainable pr/pm':>16}{'chains':>7}{'breaks':>7}{'/100 calls':>11}{'build Mtok/s pr/pm':>20}"
        "  break reasons"
    )
    tot = {b: Measured() for b in BUILDERS}
    for (harness, mode), sessions in recs.items():
        pr, pm = (measure(sessions, b, args.repeat) for b in BUILDERS)
        for b, m in (("per_request", pr), ("prefix_merging", pm)):
            tot[b].samples += m.samples
            tot[b].tokens += m.tokens
            tot[b].trainable += m.trainable
            tot[b].calls += m.calls
        samples = f"{pr.samples}/{pm.samples}"
        tokens = f"{pr.tokens:,}/{pm.tokens:,}"
        speed = f"{pr.tok_s / 1e6:.1f}/{pm.tok_s / 1e6:.1f}"
        trainable = f"{pr.trainable_frac:.1%}/{pm.trainable_frac:.1%}"
        print(
            f"{harness + '.' + mode:24}{len(sessions):>5}{pr.calls:>6}{samples:>15}{pr.samples / pm.samples:>6.2f}x"
            f"{tokens:>21}{pr.tokens / pm.tokens:>6.2f}x{trainable:>16}{pm.chains:>7}{pm.breaks:>7}"
            f"{100 * pm.breaks / pm.calls:>11.1f}{speed:>20}"
            f"  {dict(pm.reasons) or '-'}"
        )
    pr, pm = tot["per_request"], tot["prefix_merging"]
    print(
        f"# all {pr.calls} calls: samples {pr.samples} -> {pm.samples} ({pr.samples / pm.samples:.2f}x fewer), "
        f"trainer tokens {pr.tokens:,} -> {pm.tokens:,} ({pr.tokens / pm.tokens:.2f}x fewer; trainable "
        f"{pr.trainable_frac:.1%} -> {pm.trainable_frac:.1%}). "
        f"Polar (paper): 1,185 -> 218 trainer updates = {1185 / 218:.2f}x."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
