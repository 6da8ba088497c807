"""The learning claim, as a test: the default ``floe demo`` (12 steps instead of 10, minus its mid-run eval) on the
real SmolLM2-135M-Instruct raises the held-out solve rate.

Every service runs as its own process over a real broker (the demo's own stack); the held-out tasks (``count-heldout``:
numbers the training set never contains) run as eval sessions before the first step and after the last, with the
training sampling (temperature 1). The threshold is the measured effect with margin, not a hope: see the README's
demo section for the per-seed numbers of the default run. A run that does not learn is tried once more (``ATTEMPTS``),
and says so in the log; any infrastructure failure (a lost step, an errored eval session) fails at once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from floe.demo import Demo, DemoConfig, eval_answers
from floe.report import prompt_agnostic_best, write_report

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The default run's learning rate for 12 steps (the default is 10), evaluated only before and after (the default also
# evaluates after step 5). Shorter runs are not reliable: the untrained model solves ~2 % of the training tasks, so
# the first steps often carry no signal at all (P(no solved sample in a step of 32) ~ 0.5); 6 steps at twice the
# learning rate once ended 0.025 -> 0.025, and one CI run of 10 steps ended 0.0 -> 0.075. Two more steps are ~1 min.
STEPS = 12


# One run of the default demo fails to learn about 1 time in 6 (3 of ~19 runs, README's demo section): the untrained
# model solves ~1-2 % of the tasks, so a run can see no solved sample for half its steps, and one run collapsed after
# learning. The claim tested is therefore "a run learns", tried at most twice: a demo that no longer learns fails both
# (p ~ 0.03 of a false failure, against ~0.16 for one try), and a first failed try is printed with its numbers.
ATTEMPTS = 2


@pytest.fixture
def run_root() -> Iterator[Path]:
    # Not pytest's tmp_path (0700): sandboxed agents and graders run as other uids and must reach their work dirs.
    path = Path(tempfile.mkdtemp(prefix="floe-learns-"))
    path.chmod(0o755)
    yield path
    # The services' logs of the last run outlive it (a failure, a timeout especially, is read from them): one folder
    # per attempt.
    keep = Path(tempfile.gettempdir()) / "floe-learns-last-logs"
    shutil.rmtree(keep, ignore_errors=True)
    for logs in sorted(path.glob("attempt-*/logs")):
        shutil.copytree(logs, keep / logs.parent.name)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(3000)  # two attempts, each ~6 min here and up to 25 (the demo's own timeout_s)
def test_the_default_demo_raises_the_held_out_solve_rate_of_the_real_model(
    real_model_dir: Path, run_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed: list[str] = []
    for attempt in range(1, ATTEMPTS + 1):
        run_dir = run_root / f"attempt-{attempt}"
        run_dir.mkdir()
        run_dir.chmod(0o755)  # as run_root: sandboxed uids must reach it (mkdir's mode is cut by the umask)
        missed = run_once(real_model_dir, run_dir)
        if missed is None:
            return
        failed.append(missed)
        with capsys.disabled():  # on the terminal (CI's log) even when the next attempt passes
            print(f"\ndemo-learns attempt {attempt} of {ATTEMPTS} did not learn: {missed}")
    pytest.fail("no attempt learned: " + "; ".join(failed))


def run_once(real_model_dir: Path, run_dir: Path) -> str | None:
    """One default demo run, its infrastructure checked; None when it learned, else what it reached."""
    cfg = DemoConfig.for_model(
        "smollm2",
        steps=STEPS,
        eval_every=STEPS,
        eval_samples=1,
        dashboard=False,
        run_dir=run_dir,
        timeout_s=1500,
    )
    demo = Demo(cfg)
    try:
        demo.up()
        assert demo.model_dir == real_model_dir, "the demo trains the cached real checkpoint"
        steps, rounds = asyncio.run(demo.watch())
    finally:
        demo.down()
    # Group selection ``off`` (the default): every step publishes a version, all-equal groups included.
    assert [s.version for s in steps] == list(range(1, STEPS + 1))
    assert [(r.round, r.at_version) for r in rounds] == [(0, 0), (1, STEPS)]
    assert all(r.sessions == 40 and r.errors == 0 for r in rounds), rounds
    before, after = rounds[0].solve_rate, rounds[1].solve_rate
    assert before is not None and after is not None
    agnostic = prompt_agnostic_best(eval_answers(cfg))
    assert agnostic is not None and agnostic <= 0.05
    assert all(s.trainable_tokens > 0 and s.groups_dropped == 0 for s in steps)
    summary = json.loads(
        (write_report(run_dir / "report", steps, demo.config_dict(), rounds, agnostic) / "summary.json").read_text()
    )
    assert summary["eval_solve_rate_before"] == round(before, 4)
    assert summary["eval_solve_rate_after"] == round(after, 4)
    assert summary["prompt_agnostic_best"] == round(agnostic, 4)
    assert summary["groups_dropped"] == sum(s.groups_dropped for s in steps)
    # See the README's demo section for the measured runs; 0.2 (8 of 40 tasks) leaves room for sampling noise.
    if after - before >= 0.2 and after > agnostic + 0.15:
        return None
    solved = ", ".join(f"{s.resolved_fraction:.2f}" for s in steps)
    return f"held-out solve rate {before} -> {after} (prompt-agnostic best {agnostic}); solved per step: {solved}"
