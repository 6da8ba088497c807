"""bench/rollout_load runs end to end on a small load: every group reaches exactly one committed batch, with one
rollout instance and with two.

The bench itself fails on a group batched twice or missing at its deadline; this keeps it from rotting and checks
that the figures it writes are the ones it measured (calls counted from the generated load, rates positive).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def test_rollout_load_bench_folds_every_group_once(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        str(ROOT / "bench" / "rollout_load" / "run.py"),
        "--groups", "6", "--group-size", "2", "--groups-per-batch", "2", "--turns", "2,4",
        "--system-len", "200", "--rates", "0,40", "--instances", "1,2", "--timeout-s", "120",
    ]  # fmt: skip
    env = {**os.environ, "FLOE_BENCH_DIR": str(tmp_path)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads((tmp_path / "rollout_load.json").read_text())
    assert figures["groups"] == 6 and figures["group_size"] == 2
    first = proc.stdout.splitlines()[0]
    assert f"{figures['calls']} model calls" in first  # what it folded is what it generated
    assert figures["calls"] >= 6 * 2 * 2
    for tag in ("max", "at40"):
        assert figures[f"calls_per_s_{tag}"] > 0 and figures[f"cpu_ms_per_call_{tag}"] > 0
        assert figures[f"group_latency_p50_s_{tag}"] <= figures[f"group_latency_p95_s_{tag}"]
    assert "folded calls/s" in proc.stdout and "folded / offered at 40/s" in proc.stdout
    # Two instances share the 32 input partitions (4 topics x 8) and between them assemble every group once.
    assert figures["calls_per_s_2_instances"] > 0
    assert sum(int(g) for g in figures["groups_per_instance_2_instances"].split("/")) == 6
    assert 1.0 <= figures["partitions_max_over_mean_2_instances"] <= 2.0
    assert "several instances on one consumer group" in proc.stdout
