"""The builder benchmark runs on generated sessions and on a JSONL of recorded calls."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from contracts import TokenizationMode

from .simulate import random_ops, simulate_session

BENCH = Path(__file__).resolve().parents[3] / "bench" / "rollout" / "run.py"


def _run(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(BENCH), *args, "--json", "--repeat", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def test_bench_on_generated_sessions() -> None:
    report = _run("--sessions", "3", "--turns", "3", "6", "--mode", "canonical")
    pr, pm = report["results"]["per_request"], report["results"]["prefix_merging"]
    assert pr["trainable_tokens"] == pm["trainable_tokens"] > 0
    assert pr["samples"] == pr["calls"] >= pm["samples"]
    assert report["ratios"]["trainer_tokens"] == pr["trainer_tokens"] / pm["trainer_tokens"] >= 1


def test_bench_on_recorded_jsonl(tmp_path: Path) -> None:
    rng = random.Random(5)
    path = tmp_path / "calls.jsonl"
    with path.open("w") as fh:
        for i in range(2):
            for call in simulate_session(
                f"rec-{i}", random_ops(rng, 5, out_len=(1, 9), tool_len=(1, 9)), TokenizationMode.EXACT, rng
            ):
                fh.write(call.model_dump_json() + "\n")
    report = _run("--jsonl", str(path))
    assert report["results"]["per_request"]["samples"] == 10
    assert report["results"]["prefix_merging"]["breaks"] == 0
