"""The demo's report folder: solve rates per step (PNG), the config, and summary numbers (JSON + Markdown).

Pure file output from numbers the demo collected off the topics; nothing here talks to a service.

The headline is the held-out solve rate (``eval_solve_rate_before`` -> ``eval_solve_rate_after``) next to
``prompt_agnostic_best``: the most a reply that ignores the question could solve of the held-out set (the best single
constant answer). A training reward alone is not evidence of learning: a format-only policy can raise it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["EvalRound", "StepRecord", "prompt_agnostic_best", "summarize", "write_report"]


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
    # Every graded train session of this rollout step, groups dropped by group selection included.
    train_sessions: int = 0
    train_solve_rate: float | None = None
    groups_dropped: int = 0


@dataclass(frozen=True)
class EvalRound:
    """One pass over the held-out set: ``at_version`` is the learner version it was admitted at (0: before step 1)."""

    round: int
    at_version: int
    sessions: int
    errors: int  # infrastructure errors: left out of the rate, never counted as wrong
    solve_rate: float | None


def prompt_agnostic_best(answers: Sequence[str]) -> float | None:
    """The best solve rate of one constant reply on tasks with these answers (None: no tasks)."""
    if not answers:
        return None
    return max(Counter(answers).values()) / len(answers)


def summarize(
    steps: Sequence[StepRecord],
    rounds: Sequence[EvalRound] = (),
    agnostic: float | None = None,
    window: int = 3,
) -> dict[str, Any]:
    """Held-out solve rate before vs after (the headline when there is an eval), first vs last ``window`` steps'
    mean reward and train solve rate, plus totals."""
    if not steps:
        return {"steps": 0}
    w = max(1, min(window, len(steps) // 2 or 1))
    first = [s.reward_mean for s in steps[:w]]
    last = [s.reward_mean for s in steps[-w:]]
    first_mean, last_mean = sum(first) / len(first), sum(last) / len(last)
    out: dict[str, Any] = {
        "steps": len(steps),
        "sessions": sum(s.sessions for s in steps),
        "window": w,
        "reward_first": round(first_mean, 4),
        "reward_last": round(last_mean, 4),
        "reward_gain": round(last_mean - first_mean, 4),
        "train_solve_rate_first": _mean([s.train_solve_rate for s in steps[:w]]),
        "train_solve_rate_last": _mean([s.train_solve_rate for s in steps[-w:]]),
        "groups_dropped": sum(s.groups_dropped for s in steps),
        "final_version": steps[-1].version,
        "trainable_tokens": sum(s.trainable_tokens for s in steps),
        "wall_clock_s": round(steps[-1].elapsed_s, 1),
    }
    if rounds:
        before, after = rounds[0].solve_rate, rounds[-1].solve_rate
        out.update(
            {
                "eval_solve_rate_before": None if before is None else round(before, 4),
                "eval_solve_rate_after": None if after is None else round(after, 4),
                "eval_gain": None if before is None or after is None else round(after - before, 4),
                "eval_rounds": [asdict(r) for r in rounds],
                "prompt_agnostic_best": None if agnostic is None else round(agnostic, 4),
                "above_prompt_agnostic": None if after is None or agnostic is None else round(after - agnostic, 4),
            }
        )
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return round(sum(xs) / len(xs), 4) if xs else None


def write_report(
    out: Path,
    steps: Sequence[StepRecord],
    config: Mapping[str, Any],
    rounds: Sequence[EvalRound] = (),
    agnostic: float | None = None,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(steps, rounds, agnostic)
    (out / "config.json").write_text(json.dumps(dict(config), indent=2, sort_keys=True, default=str) + "\n")
    (out / "steps.json").write_text(json.dumps([asdict(s) for s in steps], indent=2) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(out / "reward.png", steps, rounds, summary)
    lines = ["# floe demo report", ""]
    if rounds:
        lines += [
            f"- held-out solve rate: {summary['eval_solve_rate_before']} before step 1 -> "
            f"{summary['eval_solve_rate_after']} after step {rounds[-1].at_version} "
            f"(gain {summary['eval_gain']}); a prompt-agnostic answer solves at most "
            f"{summary['prompt_agnostic_best']}, "
            f"so the trained policy is {summary['above_prompt_agnostic']} above it",
            "- eval rounds: "
            + ", ".join(
                f"v{r.at_version}: {'n/a' if r.solve_rate is None else f'{r.solve_rate:.3f}'} ({r.sessions})"
                for r in rounds
            ),
        ]
    lines += [
        f"- steps: {summary.get('steps', 0)}, sessions in batches: {summary.get('sessions', 0)}, "
        f"groups dropped (no signal): {summary.get('groups_dropped', 0)}",
        f"- train solve rate, first {summary.get('window')} steps: {summary.get('train_solve_rate_first')}; "
        f"last {summary.get('window')}: {summary.get('train_solve_rate_last')}",
        f"- mean batch reward, first {summary.get('window')} steps: {summary.get('reward_first')}; "
        f"last {summary.get('window')}: {summary.get('reward_last')}",
        f"- wall clock: {summary.get('wall_clock_s')} s; final weight version: {summary.get('final_version')}",
        "",
        "| step | version | train solved | batch sessions | batch reward mean | std | groups dropped "
        "| trainable tokens | loss |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {s.step} | {s.version} | {'' if s.train_solve_rate is None else f'{s.train_solve_rate:.3f}'} | "
            f"{s.sessions} | {s.reward_mean:.3f} | {s.reward_std:.3f} | {s.groups_dropped} | {s.trainable_tokens} | "
            f"{'' if s.loss is None else f'{s.loss:.4f}'} |"
            for s in steps
        ),
        "",
        "![solve rate per step](reward.png)",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    return out


def _plot(path: Path, steps: Sequence[StepRecord], rounds: Sequence[EvalRound], summary: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    xs = [s.step for s in steps]
    ys = [s.reward_mean for s in steps]
    err = [s.reward_std / math.sqrt(max(1, s.sessions)) for s in steps]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color="#1f77b4", alpha=0.5, label="batch reward (± s.e.)")
    train = [(s.step, s.train_solve_rate) for s in steps if s.train_solve_rate is not None]
    if train:
        ax.plot([x for x, _ in train], [y for _, y in train], marker="s", color="#2ca02c", label="train solve rate")
    title = f"floe demo: reward {summary.get('reward_first', 0):.3f} → {summary.get('reward_last', 0):.3f}"
    done = [(r.at_version, r.solve_rate) for r in rounds if r.solve_rate is not None]
    if done:
        ax.plot(
            [x for x, _ in done],
            [y for _, y in done],
            marker="D",
            color="#d62728",
            linewidth=2,
            label="held-out solve rate",
        )
        title = f"floe demo: held-out solved {done[0][1]:.2f} → {done[-1][1]:.2f}"
        best = summary.get("prompt_agnostic_best")
        if best is not None:
            ax.axhline(best, color="#7f7f7f", linestyle="--", label="best prompt-agnostic answer")
    ax.set_xlabel("training step (weight version)")
    ax.set_ylabel("solve rate / reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{title} over {len(steps)} steps")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
