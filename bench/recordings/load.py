"""Load the recorded sessions: ``data/<harness>.<mode>.jsonl.gz`` -> per (harness, mode) lists of sessions.

Role: the one reader of the recordings for the benchmarks (``bench_rollout.py``, ``bench/learner/run.py``). Each line
is ``contracts.encode(ModelCallRecorded)``; a session's calls are returned sorted by ``call_index``.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from pathlib import Path

import contracts
from contracts import ModelCallRecorded

__all__ = ["DATA", "load_file", "load_recordings"]

DATA = Path(__file__).resolve().parent / "data"


def load_file(path: Path) -> list[list[ModelCallRecorded]]:
    """The sessions of one recording file (plain or gzipped JSONL), in order of first appearance."""
    opener = gzip.open if path.suffix == ".gz" else open
    by_session: dict[str, list[ModelCallRecorded]] = defaultdict(list)
    with opener(path, "rb") as fh:
        for line in fh:
            if line.strip():
                event = contracts.decode(ModelCallRecorded, line)
                by_session[event.session_id].append(event)
    return [sorted(calls, key=lambda c: c.call_index) for calls in by_session.values()]


def load_recordings(directory: Path = DATA) -> dict[tuple[str, str], list[list[ModelCallRecorded]]]:
    """``{(harness, mode): sessions}`` for every ``<harness>.<mode>.jsonl[.gz]`` in ``directory``."""
    out: dict[tuple[str, str], list[list[ModelCallRecorded]]] = {}
    for path in sorted(directory.glob("*.jsonl*")):
        harness, mode = path.name.split(".")[:2]
        out[(harness, mode)] = load_file(path)
    if not out:
        raise FileNotFoundError(f"no recordings (*.jsonl[.gz]) in {directory}")
    return out
