"""Our reimplementation of swebench 5.0.2's grading equals the official one on real and crafted logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scorer.grading import END_MARKER, START_MARKER, ResolvedStatus, get_eval_report, get_logs_eval, parse_log_pytest

SAMPLES: list[dict[str, Any]] = json.loads((Path(__file__).parent / "data" / "swebench_parity.json").read_text())


def test_parity_fixture_covers_the_rules() -> None:
    names = {s["name"] for s in SAMPLES}
    assert {"forged-passes-nonzero-exit", "skipped-f2p", "truncated-param-ambiguous", "apply-failed"} <= names
    assert len(SAMPLES) >= 20


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["name"] for s in SAMPLES])
def test_same_verdict_as_swebench(sample: dict[str, Any]) -> None:
    expected = sample["expected"]
    status, found, _reason = get_logs_eval(sample["log"])
    assert status == expected["status"]
    assert found == expected["found"]
    report = get_eval_report(sample["log"], sample["FAIL_TO_PASS"], sample["PASS_TO_PASS"])
    assert report.resolved == expected["resolved"]
    if expected["tests_status"] is not None:
        ts = expected["tests_status"]
        assert report.f2p_success == ts["FAIL_TO_PASS"]["success"]
        assert report.f2p_failure == ts["FAIL_TO_PASS"]["failure"]
        assert report.p2p_success == ts["PASS_TO_PASS"]["success"]
        assert report.p2p_failure == ts["PASS_TO_PASS"]["failure"]


def test_parse_failed_line_with_message() -> None:
    assert parse_log_pytest("FAILED a.py::t - assert 1 == 2\nPASSED a.py::u\n") == {
        "a.py::t": "FAILED",
        "a.py::u": "PASSED",
    }


def test_partial_status() -> None:
    log = "+ : '>>>>> Start Test Output'\nPASSED t::a\nFAILED t::b\n+ : '>>>>> End Test Output'\n"
    report = get_eval_report(log, ["t::a", "t::b"], [])
    assert report.status is ResolvedStatus.PARTIAL and not report.resolved
    assert report.f2p_ratio == 0.5 and report.p2p_ratio == 1.0


def test_forged_exit_code_printed_by_the_diff_is_ignored() -> None:
    # floe hardening: the diff's code prints a fake exit-code record and a fake END marker before the real ones
    log = (
        "+ : '>>>>> Start Test Output'\nPASSED t::a\n>>>>> Test Exit Code: 0\n"
        "+ : '>>>>> End Test Output'\nFAILED t::a\n>>>>> Test Exit Code: 1\n"
    )
    _status, found, reason = get_logs_eval(log)
    assert not found and "forged" in reason


def test_listed_tests_the_log_never_mentions_are_told_apart_from_failures() -> None:
    log = f"{START_MARKER}\nPASSED a.py::t\nFAILED a.py::u\n{END_MARKER}\n>>>>> Test Exit Code: 1\n"
    report = get_eval_report(log, ["a.py::t"], ["a.py::u", "b.py::never", "b.py::also_never"])
    assert not report.resolved  # SWE-bench's verdict: a missing PASS_TO_PASS test counts as broken
    assert report.p2p_failure == ["a.py::u", "b.py::never", "b.py::also_never"]
    assert report.missing == ["b.py::never", "b.py::also_never"]
    assert report.reason == (
        "0 FAIL_TO_PASS failing, 3 PASS_TO_PASS broken"
        " (2 of them never ran: not in the test output, so never collected)"
    )
    assert get_eval_report(log, ["a.py::t"], []).missing == []
