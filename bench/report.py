"""Where a benchmark leaves its figures: ``.floe/bench/<bench>.json`` (flat keys, numbers or short strings).

Each ``bench/<name>/run.py`` prints its table for people and calls :func:`write` once with the same figures, so a
script (or the next session) can compare runs without parsing the table. Import it with
``sys.path.insert(0, str(Path(__file__).resolve().parents[1]))`` then ``from report import write``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

__all__ = ["out_dir", "write"]

_ROOT = Path(__file__).resolve().parents[1]

Figure = int | float | str | bool | None


def out_dir() -> Path:
    """``$FLOE_BENCH_DIR`` or ``<repo>/.floe/bench``."""
    return Path(os.environ.get("FLOE_BENCH_DIR") or _ROOT / ".floe" / "bench")


def write(bench: str, figures: dict[str, Figure]) -> Path:
    """Write ``figures`` (flat: no nesting) with when and where they were measured; return the file's path."""
    for key, value in figures.items():
        if not isinstance(value, int | float | str | bool | type(None)):
            raise TypeError(f"{bench}: figure {key!r} is {type(value).__name__}; keep the JSON flat")
    path = out_dir() / f"{bench}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "bench": bench,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        **figures,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    print(f"\nfigures written to {path}")
    return path
