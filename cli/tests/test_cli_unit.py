"""floe CLI without a broker: argument handling, topic resolution, positions, lazy delegation errors."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from contracts import MODEL_CALLS
from eventbus.replay import parse_position
from floe.cli import _hoist_state_dir, build_parser, main
from floe.services_cmd import DELEGATES, resolve_alias
from floe.topics_cmd import resolve_topic


def test_state_dir_is_accepted_anywhere() -> None:
    assert _hoist_state_dir(["kafka", "up", "--state-dir", "/x"]) == ["--state-dir", "/x", "kafka", "up"]
    assert _hoist_state_dir(["kafka", "--state-dir=/y", "status"]) == ["--state-dir=/y", "kafka", "status"]
    args = build_parser().parse_args(_hoist_state_dir(["kafka", "up", "--port", "0", "--state-dir", "/s"]))
    assert (args.state_dir, args.kafka_cmd, args.port) == ("/s", "up", 0)


def test_replay_arguments_parse_offsets_and_times() -> None:
    args = build_parser().parse_args(
        ["replay", "--topic", "floe.rewards", "--from", "5", "--to", "2026-11-30T01:00:00Z", "--partition", "2"]
    )
    assert args.start.offset == 5 and args.end.timestamp_ms == 1796000400000 and args.partition == [2]


def test_bad_position_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--topic", "floe.rewards", "--from", "yesterday"])
    assert exc.value.code == 2
    assert "neither an offset nor an ISO-8601 time" in capsys.readouterr().err


def test_parse_position() -> None:
    assert parse_position("0").offset == 0
    assert parse_position("2026-11-30T01:00:00").timestamp_ms == 1796000400000  # naive = UTC
    assert parse_position("2026-11-30T02:00:00+01:00").timestamp_ms == 1796000400000
    with pytest.raises(ValueError):
        parse_position("-3")


def test_resolve_topic_accepts_registry_names_and_suffixed_copies() -> None:
    assert resolve_topic("floe.model-calls") is MODEL_CALLS
    copy = resolve_topic("floe.model-calls.t-abc")
    assert copy.name == "floe.model-calls.t-abc" and copy.model is MODEL_CALLS.model
    with pytest.raises(KeyError, match="not a registry topic"):
        resolve_topic("nope")


def test_unknown_topic_in_replay_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--topic", "nope"]) == 2
    assert "not a registry topic" in capsys.readouterr().err


def test_delegation_to_a_missing_service_cli_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert DELEGATES["tasks"] == "floe_tasks.cli" and DELEGATES["inference"] == "inference.cli"
    # (Probing the real services here would import torch; a missing package takes the same code path.)
    monkeypatch.setitem(DELEGATES, "scorer", "floe_no_such_package.cli")
    assert main(["scorer", "--help"]) == 2
    assert "needs floe_no_such_package.cli" in capsys.readouterr().err


def test_delegation_imports_the_service_cli_lazily_and_hands_it_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A real package on disk, imported through the normal machinery, exactly as a service's cli.py would be.
    pkg = tmp_path / "floeprobe_svc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("def main(argv=None):\n    print('argv', argv)\n    return 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(DELEGATES, "scorer", "floeprobe_svc.cli")
    assert "floeprobe_svc.cli" not in sys.modules
    assert main(["scorer", "grade", "--fast"]) == 7
    assert capsys.readouterr().out == "argv ['grade', '--fast']\n"
    monkeypatch.delitem(sys.modules, "floeprobe_svc.cli")
    monkeypatch.delitem(sys.modules, "floeprobe_svc")


def test_tasks_validate_is_an_alias_of_the_scorer_command() -> None:
    assert resolve_alias(["tasks", "validate", "--no-grade"]) == (
        "score",
        ["validate", "--source", "bundled", "--no-grade"],
    )
    # options `floe tasks` takes before its subcommand travel with it, after the alias's own default
    assert resolve_alias(["tasks", "--source", "toy", "validate"]) == (
        "score",
        ["validate", "--source", "bundled", "--source", "toy"],
    )
    assert resolve_alias(["tasks", "--source=toy", "validate", "--workers", "1"]) == (
        "score",
        ["validate", "--source", "bundled", "--source=toy", "--workers", "1"],
    )
    assert resolve_alias(["tasks", "--source", "toy", "list"]) is None  # the library's own commands stay its own
    assert resolve_alias(["tasks", "list"]) is None


def test_task_validation_works_under_both_spellings(capsys: pytest.CaptureFixture[str]) -> None:
    # the real scorer CLI behind the real entry point; --no-grade: data checks only, no sandbox
    for argv in (
        ["score", "validate", "--source", "toy", "--no-grade"],
        ["scorer", "validate", "--source", "toy", "--no-grade"],
        ["tasks", "--source", "toy", "validate", "--no-grade"],
        ["tasks", "validate", "--no-grade", "--source", "toy"],
    ):
        assert main(argv) == 0, argv
        assert "structure ok: 25 tasks" in capsys.readouterr().out
    assert main(["tasks", "validate", "--no-grade"]) == 0  # `floe tasks` still means the bundled set
    assert "structure ok: 24 tasks" in capsys.readouterr().out
    assert main(["tasks", "--source", "toy", "list"]) == 0  # not an alias: the library's own command
    assert len(capsys.readouterr().out.splitlines()) == 25


def test_a_task_source_is_one_flag_name_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    # `--task-source` (as `floe session run` and the settings spell it) in every command, `--source` kept as an alias,
    # before or after the subcommand.
    for argv in (
        ["score", "validate", "--task-source", "toy", "--no-grade"],
        ["tasks", "validate", "--task-source", "toy", "--no-grade"],
        ["tasks", "--task-source", "toy", "validate", "--no-grade"],
    ):
        assert main(argv) == 0, argv
        assert "structure ok: 25 tasks" in capsys.readouterr().out
    for argv in (["tasks", "list", "--task-source", "toy"], ["tasks", "list", "--source", "toy"]):
        assert main(argv) == 0, argv
        assert len(capsys.readouterr().out.splitlines()) == 25
    assert main(["tasks", "--source", "toy", "list", "--task-source", "bundled"]) == 0  # the later one wins
    assert len(capsys.readouterr().out.splitlines()) == 24


def test_serve_refuses_a_service_without_main_module(capsys: pytest.CaptureFixture[str]) -> None:
    if not _importable("scorer.__main__"):  # the scorer package exists but has no __main__ yet
        assert main(["serve", "scorer"]) == 2
        assert "not runnable here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "not-a-service"])


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_sigpipe_is_default_only_while_a_filter_command_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`floe replay … | head` ends quietly (SIGPIPE at its default while it runs), but the disposition must not
    outlive the command: with it, a write to any closed socket kills the process. A CI run died of exactly that:
    an in-process `main()` left SIGPIPE at its default, and a gateway test's write to a closed connection killed
    pytest. Nor may a command that runs servers in this process (`floe serve`, `session run`, `demo`) get it."""
    seen: list[object] = []
    real = signal.signal

    def spy(signum: int, handler: object) -> object:
        if signum == signal.SIGPIPE:
            seen.append(handler)
        return real(signum, handler)  # type: ignore[arg-type]

    before = signal.getsignal(signal.SIGPIPE)
    signal.signal = spy  # type: ignore[assignment]
    try:
        assert main(["replay", "--topic", "nope"]) == 2
        assert seen == [signal.SIG_DFL, before]
        seen.clear()
        with pytest.raises(SystemExit):
            main(["serve", "no-such-service"])
        assert seen == []
    finally:
        signal.signal = real
    capsys.readouterr()
    assert signal.getsignal(signal.SIGPIPE) == before == signal.SIG_IGN
