"""Bundled task source (data for build_bundled.py)."""

TEST = """from nested import flatten


def test_flat():
    assert flatten([1, 2]) == [1, 2]


def test_nested():
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]
"""
TASK = {
    "repo": "floe/nested",
    "number": 2,
    "created_at": "2026-01-20T10:00:00Z",
    "problem_statement": """flatten() hits RecursionError on strings

`flatten(["ab", ["cd"]])` raises `RecursionError: maximum recursion depth exceeded`. Strings (and
bytes) are iterable but should be treated as atoms: expected `["ab", "cd"]`. Tuples should still be
flattened.
""",
    "files": {
        "nested/__init__.py": "from nested.flat import flatten\n",
        "nested/flat.py": '''"""Flatten arbitrarily nested iterables."""
from collections.abc import Iterable


def flatten(items):
    out = []
    for item in items:
        if isinstance(item, Iterable):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
''',
        "tests/test_flat.py": TEST,
    },
    "fix": {
        "nested/flat.py": [
            ("if isinstance(item, Iterable):", "if isinstance(item, Iterable) and not isinstance(item, (str, bytes)):")
        ]
    },
    "tests": {
        "tests/test_flat.py": TEST
        + """

def test_strings_are_atoms():
    assert flatten(["ab", ["cd"]]) == ["ab", "cd"]
    assert flatten([b"x", (1, (2,))]) == [b"x", 1, 2]
"""
    },
}
