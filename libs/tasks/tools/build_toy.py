"""Build the demo's answer task sets: ``toy`` (``floe_tasks/toy/``) and ``count`` / ``count-heldout``
(``floe_tasks/count/``), each a JSONL next to ``repos/floe__toy.bundle``.

- ``toy`` (``floe demo --model tiny``): one-digit sums graded with partial credit for replying in digits (see
  ``scorer.evaluators.answer.score_answer``), so a tiny randomly initialised model has a dense enough reward to learn
  from within minutes on a CPU.
- ``count`` (the default demo, SmolLM2-135M-Instruct): "What number comes after / before N?" for two-digit N, graded
  exactly (``first_number``: the first integer of the reply must be the answer; 1 or 0, no format credit). The numbers
  are split once, at random with a fixed seed: ``heldout.jsonl`` holds 20 numbers (40 tasks) never trained on,
  ``train.jsonl`` the other 68 (136 tasks). The untrained model mostly answers in prose (about 1-5 % solved at
  temperature 1); a constant answer can solve at most 2 of the 40 held-out tasks (5 %).

The repository is a one-file placeholder: the toy agent only writes ``answer.txt``. Deterministic: the same script
gives the same bytes (fixed author, dates, content and split seed).

Run: python libs/tasks/tools/build_toy.py
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "floe_tasks"
OUT = PACKAGE / "toy"
COUNT_OUT = PACKAGE / "count"
HELDOUT_NUMBERS = 20
REPO = "floe/toy"
ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "floe",
    "GIT_AUTHOR_EMAIL": "floe@localhost",
    "GIT_COMMITTER_NAME": "floe",
    "GIT_COMMITTER_EMAIL": "floe@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    (OUT / "repos").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "toy"
        repo.mkdir()
        _git("init", "-q", "-b", "main", cwd=repo)
        (repo / "README.md").write_text("Answer the question in TASK.md: write only the answer to answer.txt.\n")
        _git("add", "-A", cwd=repo)
        _git("commit", "-q", "-m", "toy workspace", cwd=repo)
        base = _git("rev-parse", "HEAD", cwd=repo)
        bundle = OUT / "repos" / "floe__toy.bundle"
        bundle.unlink(missing_ok=True)
        _git("bundle", "create", "-q", str(bundle), "main", cwd=repo)
    rows = []
    for a in range(5):
        for b in range(5):
            rows.append(
                {
                    "instance_id": f"floe__toy-add-{a}-{b}",
                    "repo": REPO,
                    "base_commit": base,
                    "problem_statement": f"What is {a} + {b}? Reply with the number only.",
                    "evaluator": "answer",
                    "answer": str(a + b),
                    "answer_credit": "digits",
                    "created_at": "2026-01-01T00:00:00Z",
                    "version": "1",
                }
            )
    (OUT / "tasks.jsonl").write_text(_jsonl(rows))
    print(f"wrote {len(rows)} toy tasks to {OUT}")
    build_count(base, bundle)


def _jsonl(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def _count_task(n: int, kind: str, base: str) -> dict[str, str]:
    word, answer = ("after", n + 1) if kind == "next" else ("before", n - 1)
    return {
        "instance_id": f"floe__count-{kind}-{n}",
        "repo": REPO,
        "base_commit": base,
        "problem_statement": f"What number comes {word} {n}? Reply with the number only.",
        "evaluator": "answer",
        "answer": str(answer),
        "answer_credit": "first_number",
        "created_at": "2026-01-01T00:00:00Z",
        "version": "1",
    }


def build_count(base: str, bundle: Path) -> None:
    numbers = list(range(11, 99))  # n - 1 and n + 1 stay two-digit
    random.Random(20261201).shuffle(numbers)
    heldout, train = sorted(numbers[:HELDOUT_NUMBERS]), sorted(numbers[HELDOUT_NUMBERS:])
    (COUNT_OUT / "repos").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundle, COUNT_OUT / "repos" / bundle.name)
    for name, nums in (("train", train), ("heldout", heldout)):
        rows = [_count_task(n, kind, base) for n in nums for kind in ("next", "prev")]
        (COUNT_OUT / f"{name}.jsonl").write_text(_jsonl(rows))
        print(f"wrote {len(rows)} count tasks to {COUNT_OUT / name}.jsonl")


if __name__ == "__main__":
    main()
