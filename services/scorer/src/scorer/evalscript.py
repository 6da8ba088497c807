"""The bash eval script run inside the sandbox, in SWE-bench's harness shape.

One script does what the official harness does in two steps (``run_instance`` applies the model patch, then
``eval.sh`` runs), so one sandbox start grades one diff:

1. copy the pristine testbed (read-only input) into the writable, size-capped ``$TESTBED``;
2. apply the model patch with SWE-bench 5.0.2's fallback chain (``git apply -v``, ``--3way``, ``--reject``,
   ``patch --batch --forward --fuzz=5 -p1``, with ``git checkout -- . && git clean -fd`` before each attempt, then
   the ``--check --reverse`` "already applied" test); on failure print ``>>>>> Patch Apply Failed`` and stop;
3. (floe hardening, ``protect_test_infra``) undo the patch's changes to test-infrastructure files (``conftest.py``,
   pytest/tox/setup config, ``sitecustomize.py``): a conftest hook can rewrite every outcome to "passed" and the exit
   code to 0, which SWE-bench's exit-code check cannot see;
4. run the task's ``prepare`` commands, reset the test files to ``base_commit`` (files the test patch creates are
   removed, so a patch cannot pre-empt them), apply the hidden test patch from a heredoc;
5. ``: '>>>>> Start Test Output'``, the test command on the test patch's files, record the exit code,
   ``: '>>>>> End Test Output'``, ``>>>>> Test Exit Code: N``.

The script runs under ``set -uxo pipefail`` without ``-e``; the markers are echoed by ``set -x`` on stderr, so the
runner must merge stderr into stdout (every backend does).
"""

from __future__ import annotations

import shlex

from floe_tasks import Task
from scorer.grading import APPLY_FAILED, END_MARKER, EXIT_CODE_MARKER, START_MARKER

__all__ = ["APPLIED_PREFIX", "PROTECTED_PATTERN", "SANDBOX_UP", "build_eval_script"]

SANDBOX_UP = ">>>>> floe sandbox up"
APPLIED_PREFIX = ">>>>> floe applied:"
HEREDOC = "EOF_114329324912"
# Files whose changes can forge test results without touching the code under test.
PROTECTED_PATTERN = (
    r"(^|/)(conftest\.py|pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml|sitecustomize\.py|usercustomize\.py)$"
)

APPLY_COMMANDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)


def build_eval_script(
    task: Task, *, apply_patch: bool, protect_test_infra: bool = True, conda_preamble: str = ""
) -> str:
    """The script body. Expects ``$FLOE_IN`` (read-only input: ``model.patch``, ``src/``) and ``$TESTBED``."""
    base = shlex.quote(task.base_commit)
    test_files = task.test_files
    files = " ".join(shlex.quote(f) for f in test_files)
    lines = [
        "set -uxo pipefail",
        conda_preamble,
        'if [ -d "$FLOE_IN/src" ]; then cp -a "$FLOE_IN/src/." "$TESTBED/" || exit 97; fi',
        'cd "$TESTBED" || exit 97',
        f"echo '{SANDBOX_UP}'",
        "git config --global --add safe.directory '*' 2>/dev/null",
        "git config --global user.email floe@localhost; git config --global user.name floe",
        "git config --global core.hooksPath /dev/null",
    ]
    if apply_patch:
        lines.append("applied=''")
        for cmd in APPLY_COMMANDS:
            lines.append(
                f'if [ -z "$applied" ]; then git checkout -- . ; git clean -fdq; '
                f'if {cmd} "$FLOE_IN/model.patch"; then applied={shlex.quote(cmd)}; fi; fi'
            )
        lines += [
            'if [ -z "$applied" ]; then git checkout -- . ; git clean -fdq; '
            'if git apply --check --reverse "$FLOE_IN/model.patch"; then applied=already-applied; fi; fi',
            f"if [ -z \"$applied\" ]; then echo '{APPLY_FAILED}'; exit 1; fi",
            f'echo "{APPLIED_PREFIX} $applied"',
            # A patch (through the ``patch`` fallback) could plant hooks or config in .git that later git commands
            # would run; restore git's metadata from the pristine input.
            'if [ -d "$FLOE_IN/src/.git" ]; then rm -rf .git && cp -a "$FLOE_IN/src/.git" .git; fi',
        ]
    if protect_test_infra:
        lines.append(
            "{ git diff --name-only --no-renames "
            + base
            + "; git ls-files --others --exclude-standard; } | grep -E '"
            + PROTECTED_PATTERN
            + "' | sort -u | while IFS= read -r f; do "
            + f'if git cat-file -e {base}:"$f" 2>/dev/null; then git checkout {base} -- "$f"; '
            + 'else rm -f -- "$f"; fi; echo ">>>>> floe reverted test infrastructure: $f"; done'
        )
    lines += [*task.prepare]
    for f in test_files:
        q = shlex.quote(f)
        lines.append(f"git checkout {base} -- {q} 2>/dev/null || rm -f -- {q}")
    lines += [
        f"git apply -v - <<'{HEREDOC}'",
        task.test_patch.rstrip("\n"),
        HEREDOC,
        f": '{START_MARKER}'",
        f"{task.test_cmd} {files}",
        "FLOE_TEST_EXIT_CODE=$?",
        f": '{END_MARKER}'",
        f'echo "{EXIT_CODE_MARKER} $FLOE_TEST_EXIT_CODE"',
        f"git checkout {base} -- {files} 2>/dev/null",
        "exit 0",
    ]
    return "\n".join(line for line in lines if line) + "\n"
