"""Bundled task source (data for build_bundled.py)."""

TEST = """from numkit import clamp, lerp


def test_lerp():
    assert lerp(0, 10, 0.5) == 5


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5
"""
TASK = {
    "repo": "floe/numkit",
    "number": 2,
    "created_at": "2026-01-05T08:30:00Z",
    "problem_statement": """clamp() returns the wrong bound for values above the range

`clamp(15, 0, 10)` returns `0` and `clamp(-5, 0, 10)` returns `0`; the first should be `10`.
Looks like `min`/`max` are swapped.
""",
    "files": {
        "numkit/__init__.py": "from numkit.ops import clamp, lerp\n",
        "numkit/ops.py": '''"""Numeric helpers."""


def clamp(x, lo, hi):
    """Limit x to the closed range [lo, hi]."""
    return max(lo, min(x, lo)) if x < lo else min(hi, max(x, lo)) if x <= hi else lo


def lerp(a, b, t):
    return a + (b - a) * t
''',
        "tests/test_ops.py": TEST,
    },
    "fix": {
        "numkit/ops.py": [
            (
                "return max(lo, min(x, lo)) if x < lo else min(hi, max(x, lo)) if x <= hi else lo",
                'if lo > hi:\n        raise ValueError("lo must be <= hi")\n    return max(lo, min(x, hi))',
            )
        ]
    },
    "tests": {
        "tests/test_ops.py": TEST
        + """

def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(15, 0, 10) == 10


def test_clamp_rejects_inverted_range():
    import pytest

    with pytest.raises(ValueError):
        clamp(1, 10, 0)
"""
    },
}
