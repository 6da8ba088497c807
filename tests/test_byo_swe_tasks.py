"""docs/bring-your-own-swe-tasks.md, run as a user runs it: every ``bash`` block of the guide, in order, in an empty
directory. From a repository made there with git, through a bundle, the instance as the hub's JSONL and as Parquet,
``floe score validate`` and ``floe score``, to ``floe demo --workload swe --tasks FILE`` with the real harness (pi)
grading sessions of that task. The commands come from the guide itself, so the guide cannot drift from the code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "bring-your-own-swe-tasks.md"
IID = "acme__wordcount-1"
VALIDATED = re.compile(rf"^ok +{IID} \{{'gold': 'resolved', 'empty': 'unresolved', 'test_patch_only': 'unresolved'\}}")


def guide_blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", GUIDE.read_text(), flags=re.M | re.S)


def test_the_guide_walks_from_a_repository_to_the_demo() -> None:
    """The order the slow test relies on, checked without running anything."""
    first_lines = [block.splitlines()[0] for block in guide_blocks()]
    assert first_lines[0].startswith("git init")
    steps = [
        "git -C wordcount bundle create",
        "floe tasks list --task-source my-tasks/tasks.jsonl",
        "floe score validate --task-source my-tasks/tasks.parquet",
        "floe score --task-source my-tasks/tasks.parquet",
        "floe demo --workload swe --tasks my-tasks/tasks.parquet",
    ]
    at = [next(i for i, block in enumerate(guide_blocks()) if step in block) for step in steps]
    assert at == sorted(at), "the guide's steps are out of order"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOE_", "GIT_", "VIRTUAL_ENV"))}
    env.update(
        {
            # The guide's reader has floe's venv active: `floe` and `python` are floe's.
            "PATH": f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
            "VIRTUAL_ENV": str(ROOT / ".venv"),
            "FLOE_HOME": str(tmp_path / "home"),  # the demo's runs and broker state stay in the test's directory
            # A commit needs an identity; the reader has one configured, a CI machine may not.
            "GIT_AUTHOR_NAME": "floe test",
            "GIT_AUTHOR_EMAIL": "test@localhost",
            "GIT_COMMITTER_NAME": "floe test",
            "GIT_COMMITTER_EMAIL": "test@localhost",
        }
    )
    return env


def _bash(
    script: str, cwd: Path, env: dict[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc, time.monotonic() - t0


@pytest.mark.integration
@pytest.mark.slow
def test_bring_your_own_swe_tasks_guide(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = _env(tmp_path)
    outputs: dict[str, str] = {}
    timings: dict[str, float] = {}
    for i, block in enumerate(guide_blocks(), start=1):
        name = f"{i}: {block.splitlines()[0][:60]}"
        proc, seconds = _bash(block, work, env, timeout=900 if block.startswith("floe demo") else 180)
        timings[name] = round(seconds, 1)
        assert proc.returncode == 0, (
            f"guide block failed ({proc.returncode}):\n{block}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
        outputs[name] = proc.stdout + proc.stderr
    print("guide blocks, seconds:", json.dumps(timings, indent=2))  # shown with -s: what each step costs

    # The hub's JSONL and its Parquet form load to the same task set.
    listed = next(out for name, out in outputs.items() if "floe tasks list" in name)
    digests = re.findall(r"# 1 tasks, digest (\w+)", listed)
    assert len(digests) == 2 and digests[0] == digests[1], listed
    assert listed.count(f"{IID}\tswebench\tF2P=1\tP2P=1") == 2

    # Validation: gold resolves, the empty diff and the test patch alone do not. The guide validates the Parquet
    # file; the JSONL is regraded here, uncached, to the same verdicts.
    validated = next(out for name, out in outputs.items() if "floe score validate" in name)
    assert any(VALIDATED.match(line) for line in validated.splitlines()), validated
    proc, _ = _bash("floe score validate --no-cache --task-source my-tasks/tasks.jsonl", work, env, 180)
    assert proc.returncode == 0 and any(VALIDATED.match(line) for line in proc.stdout.splitlines()), proc.stdout
    # The same data with the empty patch passing (tests that do not show the bug) is reported, and exits 1.
    proc, _ = _bash(
        "python - <<'EOF'\n"
        "import json\n"
        "row = json.loads(open('my-tasks/tasks.jsonl').read())\n"
        "row['FAIL_TO_PASS'] = row['PASS_TO_PASS']\n"
        "open('my-tasks/broken.jsonl', 'w').write(json.dumps(row) + '\\n')\n"
        "EOF\n"
        "floe score validate --no-cache --task-source my-tasks/broken.jsonl",
        work,
        env,
        180,
    )
    assert proc.returncode == 1 and "empty: expected unresolved, got resolved" in proc.stdout, proc.stdout

    scored = next(out for name, out in outputs.items() if "floe score --task-source" in name)
    assert f"{IID}: resolved (reward 1)" in scored

    # The demo trained on the user's task: its sessions were run by the real harness and graded.
    demo = next(out for name, out in outputs.items() if "floe demo" in name)
    report = re.search(r"^report: (\S+)/README\.md", demo, flags=re.M)
    assert report, demo[-3000:]
    tasks = json.loads((Path(report.group(1)) / "tasks.json").read_text())
    assert tasks["task_source"] == str(work / "my-tasks" / "tasks.parquet"), "every service got the absolute path"
    assert tasks["eval_source"] is None, "a user's set has no held-out eval unless --eval-tasks names one"
    assert set(tasks["tasks"]) == {IID}
    graded = tasks["tasks"][IID]
    assert graded["sessions"] >= 2 and graded["errors"] == 0, graded
    config = json.loads((Path(report.group(1)) / "config.json").read_text())
    assert config["harness"] == "pi" and config["workload"] == "swe"
