"""Build the demo's toy task set: ``floe_tasks/toy/tasks.jsonl`` + ``floe_tasks/toy/repos/floe__toy.bundle``.

Each task is a one-digit arithmetic question graded by the scorer's ``answer`` evaluator with partial credit for
replying in digits (see ``scorer.evaluators.answer.score_answer``), so a tiny randomly initialised model has a dense
enough reward to learn from within minutes on a CPU. The repository is a one-file placeholder: the toy agent only writes
``answer.txt``. Deterministic: the same script gives the same bundle bytes (fixed author, dates and content).

Run: python libs/tasks/tools/build_toy.py
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "floe_tasks" / "toy"
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
    (OUT / "tasks.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"wrote {len(rows)} toy tasks to {OUT}")


if __name__ == "__main__":
    main()
