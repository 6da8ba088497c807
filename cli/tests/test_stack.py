"""floe.stack against real processes: stop_all stops every service, the stubborn ones with SIGKILL, and says how."""

from __future__ import annotations

import sys
from pathlib import Path

from floe.stack import ServiceSpec, Stack

POLITE = (
    "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
    "print('re' + 'ady', flush=True); signal.pause()"
)
# "ready" is split in the code so the log's start line (which echoes the argv) never reads as ready.
STUBBORN = (
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('re' + 'ady', flush=True); signal.pause()"
)


def test_stop_all_terminates_the_polite_and_kills_the_stubborn(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    for name, code in (("polite", POLITE), ("stubborn", STUBBORN), ("polite-2", POLITE)):
        stack.start(ServiceSpec(name, [sys.executable, "-c", code], ready=lambda n=name: stack.tail(n, 1) == "ready"))
    pids = {name: stack.pid(name) for name in ("polite", "stubborn", "polite-2")}
    stack.stop_all(timeout_s=3.0)
    assert stack.dead() == ["polite", "stubborn", "polite-2"]
    for name in pids:
        assert not Path(f"/proc/{pids[name]}").exists() or "zombie" in Path(f"/proc/{pids[name]}/status").read_text()
    last = {name: stack.tail(name, 1) for name in pids}
    assert last["polite"].startswith("===== stopped (SIGTERM)"), last
    assert last["polite-2"].startswith("===== stopped (SIGTERM)"), last
    assert last["stubborn"].startswith("===== stopped (SIGKILL after SIGTERM timed out)"), last
    stack.stop_all()  # nothing left to stop: a no-op
