# ruff: noqa: E501
"""Bundled task source (data for build_bundled.py)."""

TEST = """from statlite import mean, median


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_median_odd():
    assert median([3, 1, 2]) == 2
"""
TASK = {
    "repo": "floe/statlite",
    "number": 11,
    "created_at": "2026-01-06T15:00:00Z",
    "problem_statement": """median() is wrong for even-length data and crashes on empty input

* `median([1, 2, 3, 4])` returns `3`; it should be `2.5` (the mean of the two middle values).
* `median([])` raises `IndexError`; `mean([])` raises `ZeroDivisionError`. Both should raise
  `ValueError("empty data")` like `statistics` does.
""",
    "files": {
        "statlite/__init__.py": "from statlite.central import mean, median\n",
        "statlite/central.py": '''"""Central tendency."""


def mean(data):
    return sum(data) / len(data)


def median(data):
    s = sorted(data)
    return s[len(s) // 2]
''',
        "tests/test_central.py": TEST,
    },
    "fix": {
        "statlite/central.py": [
            (
                "def mean(data):\n",
                'def _check(data):\n    if len(data) == 0:\n        raise ValueError("empty data")\n\n\ndef mean(data):\n    _check(data)\n',
            ),
            (
                "    s = sorted(data)\n    return s[len(s) // 2]\n",
                "    _check(data)\n    s = sorted(data)\n    mid = len(s) // 2\n    if len(s) % 2:\n        return s[mid]\n    return (s[mid - 1] + s[mid]) / 2\n",
            ),
        ]
    },
    "tests": {
        "tests/test_central.py": TEST
        + """

def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5


def test_empty_raises_value_error():
    import pytest

    with pytest.raises(ValueError):
        median([])
    with pytest.raises(ValueError):
        mean([])
"""
    },
}
