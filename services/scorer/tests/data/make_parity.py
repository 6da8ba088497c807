"""Regenerate ``swebench_parity.json``: verdicts of the official swebench 5.0.2 grader on sample logs.

Run in a THROWAWAY venv (swebench pulls docker, datasets, modal): ::

    uv venv /tmp/swebref && VIRTUAL_ENV=/tmp/swebref uv pip install swebench==5.0.2
    /tmp/swebref/bin/python services/scorer/tests/data/make_parity.py

Input: ``parity_logs.json`` (real logs from our bwrap runs plus crafted edge cases). Output adds, per sample,
swebench's status map, ``found``, ``resolved`` and ``tests_status``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from swebench.harness.grading import get_eval_report, get_logs_eval
from swebench.types import TestSpec

HERE = Path(__file__).parent


def main() -> None:
    samples = json.loads((HERE / "parity_logs.json").read_text())
    out = []
    for s in samples:
        spec = TestSpec(
            instance_id="floe__x-1",
            image="",
            eval_script_list=[],
            repo="floe/x",
            version="0",
            FAIL_TO_PASS=s["FAIL_TO_PASS"],
            PASS_TO_PASS=s["PASS_TO_PASS"],
            log_parser="parse_log_pytest",
            eval_type="pass_and_fail",
        )
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as fh:
            fh.write(s["log"])
        status, found = get_logs_eval(spec, fh.name)
        pred = {"instance_id": "floe__x-1", "model_name_or_path": "m", "model_patch": "x"}
        report = get_eval_report(spec, pred, fh.name, include_tests_status=True)["floe__x-1"]
        out.append(
            {
                **s,
                "expected": {
                    "status": status,
                    "found": found,
                    "resolved": report["resolved"],
                    "tests_status": report.get("tests_status"),
                },
            }
        )
    (HERE / "swebench_parity.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(out)} samples")


if __name__ == "__main__":
    main()
