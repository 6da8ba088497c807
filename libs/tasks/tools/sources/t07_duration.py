# ruff: noqa: E501
"""Bundled task source (data for build_bundled.py)."""

TEST = """from timefmt import parse_duration


def test_hours_minutes():
    assert parse_duration("1h30m") == 5400


def test_minutes():
    assert parse_duration("45m") == 2700
"""
TASK = {
    "repo": "floe/timefmt",
    "number": 14,
    "created_at": "2026-01-08T10:00:00Z",
    "problem_statement": """parse_duration ignores seconds and accepts garbage

`parse_duration("1m30s")` returns `60` (the seconds are dropped), and `parse_duration("soon")`
returns `0` instead of failing. Please support `s` and `d` units and raise `ValueError` for input
that is not a duration.
""",
    "files": {
        "timefmt/__init__.py": "from timefmt.duration import parse_duration\n",
        "timefmt/duration.py": '''"""Parse durations like 1h30m into seconds."""
import re

_UNITS = {"h": 3600, "m": 60}


def parse_duration(text):
    total = 0
    for amount, unit in re.findall(r"(\\d+)([hm])", text):
        total += int(amount) * _UNITS[unit]
    return total
''',
        "tests/test_duration.py": TEST,
    },
    "fix": {
        "timefmt/duration.py": [
            (
                '_UNITS = {"h": 3600, "m": 60}',
                '_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}\n_FULL = re.compile(r"(?:\\d+[dhms])+")',
            ),
            (
                "    total = 0\n",
                '    text = text.strip()\n    if not _FULL.fullmatch(text):\n        raise ValueError(f"not a duration: {text!r}")\n    total = 0\n',
            ),
            ('r"(\\d+)([hm])"', 'r"(\\d+)([dhms])"'),
        ]
    },
    "tests": {
        "tests/test_duration.py": TEST
        + """

def test_seconds_and_days():
    assert parse_duration("1m30s") == 90
    assert parse_duration("2d") == 172800


def test_garbage_rejected():
    import pytest

    with pytest.raises(ValueError):
        parse_duration("soon")
"""
    },
}
