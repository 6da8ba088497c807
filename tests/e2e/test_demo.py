"""The main job end to end: every service as its own process over a real broker, a few GRPO steps, the report,
and the dashboard rendering data from that real run in headless Chromium."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from floe.demo import Demo, DemoConfig
from floe.report import write_report

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / ".floe" / "test-artifacts"


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_demo_trains_end_to_end_and_the_dashboard_shows_it(tmp_path: Path) -> None:
    cfg = DemoConfig.for_model(
        "tiny", steps=3, group_size=4, groups_per_step=2, run_dir=tmp_path / "run", timeout_s=600
    )
    demo = Demo(cfg)
    try:
        demo.up()
        steps, rounds = asyncio.run(demo.watch())
        assert rounds == [], "the tiny model's toy workload has no held-out set"
        assert [s.step for s in steps] == [1, 2, 3]
        assert [s.version for s in steps] == [1, 2, 3], "each step is one new weight version"
        for s in steps:
            assert s.sessions == 8, "one batch = groups_per_step x group_size sessions"
            assert 0.0 <= s.reward_mean <= 1.0
            assert s.trainable_tokens > 0

        # The inference engine hot-reloads the learner's weights: it soon serves the last published version.
        port = demo.ports["inference"]
        deadline = time.monotonic() + 60
        served = -1
        while served != 3 and time.monotonic() < deadline:
            with urllib.request.urlopen(
                urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/completions",
                    data=json.dumps({"model": "policy", "prompt": [1, 2, 3], "max_tokens": 2}).encode(),
                    headers={"content-type": "application/json"},
                ),
                timeout=30,
            ) as resp:
                served = int(resp.headers["x-floe-weight-version"])
            time.sleep(0.2)
        assert served == 3, f"engine still serves version {served}"

        dash = f"http://127.0.0.1:{demo.ports['dashboard']}"
        state = _get(f"{dash}/api/state")
        assert len(state["reward_per_step"]) >= 3 and state["weight_version"] == 3
        assert state["sessions_by_state"]["DONE"] >= 24
        assert state["harness"][cfg.harness]["trainable_fraction"] > 0
        assert any(s["calls"] for s in state["recent_sessions"]), "recent sessions list their model calls"

        chromium = shutil.which("chromium")
        assert chromium, "headless Chromium is required (make test-deps installs Debian's chromium)"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--window-size=1400,1100",
            "--virtual-time-budget=4000",
        ]
        dom = subprocess.run(
            [chromium, *flags, "--dump-dom", dash], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        assert re.search(r'<canvas id="reward"[^>]*data-points="[3-9]"', dom), "reward plot did not render the run"
        shot = ARTIFACTS / "dashboard-real-run.png"
        subprocess.run([chromium, *flags, f"--screenshot={shot}", dash], capture_output=True, timeout=120, check=True)
        assert shot.stat().st_size > 10_000
    finally:
        demo.down()

    report = write_report(cfg.run_dir / "report", steps, demo.config_dict())
    assert (report / "reward.png").stat().st_size > 5_000
    summary = json.loads((report / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["final_version"] == 3
    leftovers = subprocess.run(
        ["pgrep", "-a", "-f", f"{cfg.run_dir}|{demo.sandbox_root}"], capture_output=True, text=True
    ).stdout.splitlines()
    assert not leftovers, "processes of the run survived:\n" + "\n".join(leftovers)
