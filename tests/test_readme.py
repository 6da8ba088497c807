"""The README is part of the product: its topic table and commands must match the code."""

from __future__ import annotations

import re
from pathlib import Path

from contracts import TOPICS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_topic_table_matches_the_registry() -> None:
    rows = re.findall(r"^\| `(floe\.[^`]+)` \| `(\w+)` \| `(\w+)` \| (\d+) \| (\d+) MiB \|", README, flags=re.M)
    documented = {name: (event, key, int(parts), int(mib)) for name, event, key, parts, mib in rows}
    actual = {
        t.name: (t.model.__name__, t.key_field, t.partitions, int(t.config["max.message.bytes"]) // (1024 * 1024))
        for t in TOPICS
    }
    assert documented == actual


def test_the_two_commands_come_first_and_exist() -> None:
    first_block = README.split("```", 2)[1]
    assert "make demo" in first_block and "make test" in first_block
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test", "bench", "test-fast"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"Makefile has no {target} target"
    assert "make test" in (ROOT / ".ci" / "run").read_text()
