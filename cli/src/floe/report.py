"""The demo's report folder: reward per step (PNG), the config, and summary numbers (JSON + Markdown).

Pure file output from numbers the demo collected off the topics; nothing here talks to a service.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["StepRecord", "summarize", "write_report"]


@dataclass(frozen=True)
class StepRecord:
    """One training step as seen on the topics: the batch the learner trained on and what it published."""

    step: int
    version: int
    sessions: int
    reward_mean: float
    reward_std: float
    resolved_fraction: float
    trainable_tokens: int
    loss: float | None
    elapsed_s: float


def summarize(steps: Sequence[StepRecord], window: int = 3) -> dict[str, Any]:
    """First vs last ``window`` steps' mean reward (the demo's headline) plus totals."""
    if not steps:
        return {"steps": 0}
    w = max(1, min(window, len(steps) // 2 or 1))
    first = [s.reward_mean for s in steps[:w]]
    last = [s.reward_mean for s in steps[-w:]]
    first_mean, last_mean = sum(first) / len(first), sum(last) / len(last)
    return {
        "steps": len(steps),
        "sessions": sum(s.sessions for s in steps),
        "window": w,
        "reward_first": round(first_mean, 4),
        "reward_last": round(last_mean, 4),
        "reward_gain": round(last_mean - first_mean, 4),
        "final_version": steps[-1].version,
        "trainable_tokens": sum(s.trainable_tokens for s in steps),
        "wall_clock_s": round(steps[-1].elapsed_s, 1),
    }


def write_report(out: Path, steps: Sequence[StepRecord], config: Mapping[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(steps)
    (out / "config.json").write_text(json.dumps(dict(config), indent=2, sort_keys=True, default=str) + "\n")
    (out / "steps.json").write_text(json.dumps([asdict(s) for s in steps], indent=2) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(out / "reward.png", steps, summary)
    lines = [
        "# floe demo report",
        "",
        f"- steps: {summary.get('steps', 0)}, sessions: {summary.get('sessions', 0)}",
        f"- mean reward, first {summary.get('window')} steps: {summary.get('reward_first')}",
        f"- mean reward, last {summary.get('window')} steps: {summary.get('reward_last')}",
        f"- wall clock: {summary.get('wall_clock_s')} s; final weight version: {summary.get('final_version')}",
        "",
        "| step | version | sessions | reward mean | reward std | trainable tokens | loss |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {s.step} | {s.version} | {s.sessions} | {s.reward_mean:.3f} | {s.reward_std:.3f} | "
            f"{s.trainable_tokens} | {'' if s.loss is None else f'{s.loss:.4f}'} |"
            for s in steps
        ),
        "",
        "![reward per step](reward.png)",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    return out


def _plot(path: Path, steps: Sequence[StepRecord], summary: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    xs = [s.step for s in steps]
    ys = [s.reward_mean for s in steps]
    err = [s.reward_std / math.sqrt(max(1, s.sessions)) for s in steps]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color="#1f77b4", label="mean reward (± s.e.)")
    ax.set_xlabel("training step (trajectory batch)")
    ax.set_ylabel("mean session reward")
    ax.set_title(
        f"floe demo: reward {summary.get('reward_first', 0):.3f} → {summary.get('reward_last', 0):.3f} "
        f"over {len(steps)} steps"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
