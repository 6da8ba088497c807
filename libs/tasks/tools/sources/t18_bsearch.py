"""Bundled task source (data for build_bundled.py)."""

TEST = """from searching import bisect_left, index_of


def test_bisect_left():
    assert bisect_left([1, 3, 5], 4) == 2


def test_found_middle():
    assert index_of([1, 3, 5, 7], 5) == 2
"""
TASK = {
    "repo": "floe/searching",
    "number": 10,
    "created_at": "2026-01-19T10:00:00Z",
    "problem_statement": """index_of crashes with IndexError for values past the end

`index_of([1, 3, 5], 9)` raises `IndexError: list index out of range` instead of returning `-1`,
and `index_of([], 1)` also crashes. `index_of([1, 3, 5], 1)` works.
""",
    "files": {
        "searching/__init__.py": "from searching.binary import bisect_left, index_of\n",
        "searching/binary.py": '''"""Binary search over sorted lists."""


def bisect_left(a, x):
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def index_of(a, x):
    """Index of x in sorted a, or -1."""
    lo, hi = 0, len(a)
    while lo <= hi:
        mid = (lo + hi) // 2
        if a[mid] == x:
            return mid
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
''',
        "tests/test_binary.py": TEST,
    },
    "fix": {
        "searching/binary.py": [
            ("    lo, hi = 0, len(a)\n    while lo <= hi:", "    lo, hi = 0, len(a) - 1\n    while lo <= hi:")
        ]
    },
    "tests": {
        "tests/test_binary.py": TEST
        + """

def test_absent_past_end():
    assert index_of([1, 3, 5], 9) == -1


def test_empty():
    assert index_of([], 1) == -1


def test_found_last():
    assert index_of([1, 3, 5], 5) == 2
"""
    },
}
