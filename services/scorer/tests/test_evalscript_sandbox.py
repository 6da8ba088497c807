"""Eval script shape and backend command lines (the docker backend is tested by its argv only)."""

from __future__ import annotations

from pathlib import Path

from floe_tasks import TaskSet
from sandbox.command import build_command
from scorer.evalscript import APPLY_COMMANDS, build_eval_script
from scorer.grading import END_MARKER, START_MARKER
from scorer.sandbox import BwrapSandbox, DockerSandbox, Job, Limits


def test_eval_script_follows_the_harness_shape() -> None:
    task = TaskSet.bundled().get("floe__seqtools-1")
    script = build_eval_script(task, apply_patch=True)
    assert script.startswith("set -uxo pipefail\n")
    positions = [script.index(cmd) for cmd in APPLY_COMMANDS]
    assert positions == sorted(positions), "fallbacks must be tried in SWE-bench's order"
    assert "git apply --check --reverse" in script
    reset = script.index(f"git checkout {task.base_commit} -- tests/test_core.py")
    heredoc = script.index("git apply -v - <<'EOF_114329324912'")
    start = script.index(START_MARKER)
    end = script.index(END_MARKER)
    assert reset < heredoc < start < end
    assert task.test_patch.strip() in script
    assert f"{task.test_cmd} tests/test_core.py" in script
    assert "conftest" in script  # test-infrastructure protection is on by default
    assert "conftest" not in build_eval_script(task, apply_patch=False, protect_test_infra=False)


def test_bwrap_job_spec_and_isolation_flags() -> None:
    sb = BwrapSandbox(ro_paths=[Path("/opt/env")])
    job = Job(input_dir=Path("/var/tmp/in"), limits=Limits(cpu_s=7, nproc=9, testbed_bytes=1234))
    spec = sb.spec(job, 61005)
    assert (spec.uid, spec.gid, spec.cwd, spec.network, spec.stderr) == (61005, 61005, "/testbed", "none", None)
    assert spec.env["PATH"] == "/floe/bin:/usr/bin:/bin" and spec.env["PYTHONHASHSEED"] == "0"
    argv = build_command(spec, Path("/run-dir"), pinned={}, lifeline_fd=5, seccomp_fd=7)
    assert "--reuid=61005" in argv and "--regid=61005" in argv and "--clear-groups" in argv
    assert "--cpu=7:8" in argv and "--nproc=9" in argv and "--core=0" in argv
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--disable-userns"):
        assert flag in argv
    # No bridge in a grading sandbox: the bash launcher, with the lifeline's fd, then the eval script.
    launcher = argv.index("/bin/bash")
    assert argv[launcher : launcher + 4] == ["/bin/bash", "-p", "/run/floe/sandbox_init.sh", "5"]
    # --tmpfs /tmp comes before the test environment's bind (later mounts would be shadowed otherwise)
    assert argv.index("/tmp") < argv.index("/opt/env")
    i = argv.index("/var/tmp/in")
    assert argv[i - 1] == "--ro-bind" and argv[i + 1] == "/floe"
    j = argv.index("/testbed")
    assert argv[j - 3 : j + 1] == ["--size", "1234", "--tmpfs", "/testbed"]
    assert argv[-2:] == ["bash", "/floe/eval.sh"]
    assert "/run" not in argv and "/var/run/docker.sock" not in argv


def test_docker_argv_for_official_images() -> None:
    sb = DockerSandbox()
    image = sb.image_for("astropy__astropy-12907")
    assert image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    argv = sb.argv(Job(input_dir=Path("/var/tmp/in"), limits=Limits(nproc=64), image=image, name="astropy-1"))
    # No --rm: the container is inspected (was it OOM-killed?) and then removed by name, also after a timeout.
    assert argv[:2] == ["docker", "run"] and "--rm" not in argv
    assert argv[argv.index("--name") + 1].startswith("floe-grade-astropy-1")
    assert argv[argv.index("--network") + 1] == "none"
    assert argv[argv.index("--pids-limit") + 1] == "64"
    assert "/var/tmp/in:/floe:ro" in argv
    assert argv[-2:] == [image, "/floe/eval.sh"]


def test_docker_grader_writes_conda_script_and_uses_the_instance_image(tmp_path: Path) -> None:
    # A docker binary that records its calls and prints what the script would: the argv and job input are ours.
    # (tests/e2e/test_docker_grading.py grades with the real engine.)
    from contracts import Outcome
    from scorer.grader import Grader

    fake = tmp_path / "docker"
    record = tmp_path / "argv.txt"
    fake.write_text(
        f'#!/bin/sh\necho "$@" >> {record}\n[ "$1" = run ] || exit 0\n'
        f'cat "$(echo "$@" | sed "s/.* -v \\([^:]*\\):.*/\\1/")/eval.sh"\n'
    )
    fake.chmod(0o755)
    grader = Grader(DockerSandbox(docker=str(fake)), None, tmp_path / "work", Limits(wall_s=10))
    task = TaskSet.bundled().get("floe__seqtools-1")
    res = grader.grade(task, task.patch)
    calls = record.read_text().splitlines()
    assert calls[0] == "image inspect swebench/sweb.eval.x86_64.floe_1776_seqtools-1:latest"
    argv = next(c for c in calls if c.startswith("run "))
    assert "swebench/sweb.eval.x86_64.floe_1776_seqtools-1:latest /floe/eval.sh" in argv
    container = argv.split("--name ")[1].split()[0]
    assert calls[-1] == f"rm -f {container}"
    assert "--network none" in argv
    # the script was printed, not run: the sandbox-up marker echo is there but no test ran
    assert "conda activate testbed" in res.log_tail
    assert res.outcome is Outcome.ERROR or res.outcome is Outcome.UNRESOLVED
