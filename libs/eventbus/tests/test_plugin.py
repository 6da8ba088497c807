"""The pytest plugin itself: a broker that cannot start FAILS the run (never skips), unit-only runs never start it,
and tests using Kafka fixtures are marked ``integration`` automatically."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

NEEDS_KAFKA = """
def test_uses_kafka(kafka_settings):
    assert kafka_settings.bootstrap_servers
"""
UNIT_ONLY = """
def test_pure():
    assert 1 + 1 == 2
"""


def run_pytest(
    tmp_path: Path, source: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_probe.py"
    test.write_text(source)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(test),
        "-p",
        "eventbus.testing",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        "-c",
        os.devnull,
        *args,
    ]
    full_env = {**os.environ, **(env or {})}
    full_env.pop("FLOE_TEST_KAFKA_BOOTSTRAP", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env, cwd=ROOT, check=False)


def test_broker_that_cannot_start_fails_the_run_with_cause_fix_and_log(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, NEEDS_KAFKA, env={"FLOE_JAVA": str(tmp_path / "no-java-here")})
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "1 error" in out and re.search(r"\d+ skipped", out) is None, out
    assert "During handling" not in out, "the failure must be one clear message, not a chained traceback"
    assert "Kafka test broker could not start" in out
    assert "java not found" in out  # the cause
    assert "kafka.sh jars" in out and "openjdk-17" in out  # the fix


def test_unit_only_runs_never_start_the_broker(tmp_path: Path) -> None:
    # With java unusable, a run that started the broker would error; this one must pass untouched.
    done = run_pytest(
        tmp_path, UNIT_ONLY + NEEDS_KAFKA, "-m", "not integration", env={"FLOE_JAVA": str(tmp_path / "no-java-here")}
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "1 passed, 1 deselected" in out, out


def test_external_broker_that_does_not_answer_fails_too(tmp_path: Path) -> None:
    from eventbus.broker import free_port

    test = tmp_path / "test_probe.py"
    test.write_text(NEEDS_KAFKA)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(test),
        "-p",
        "eventbus.testing",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        "-c",
        os.devnull,
    ]
    env = {**os.environ, "FLOE_TEST_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}", "FLOE_TEST_KAFKA_START_TIMEOUT": "2"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "does not answer" in out and "1 error" in out, out
