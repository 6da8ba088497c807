"""Bundled task source (data for build_bundled.py)."""

TEST = """from seqtools import chunk, window


def test_chunk_even():
    assert chunk([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_chunk_empty():
    assert chunk([], 3) == []


def test_window():
    assert window([1, 2, 3], 2) == [(1, 2), (2, 3)]
"""
TASK = {
    "repo": "floe/seqtools",
    "number": 1,
    "created_at": "2026-01-02T10:00:00Z",
    "problem_statement": """chunk() silently drops the last partial chunk

`seqtools.chunk([1, 2, 3, 4, 5], 2)` returns `[[1, 2], [3, 4]]`. The trailing `[5]` is lost, so
anyone batching records with `chunk` loses data whenever the length is not a multiple of the size.

Expected: `[[1, 2], [3, 4], [5]]`.
""",
    "files": {
        "seqtools/__init__.py": "from seqtools.core import chunk, window\n\n__all__ = ['chunk', 'window']\n",
        "seqtools/core.py": '''"""Sequence helpers."""


def chunk(items, size):
    """Split items into lists of at most `size` elements, in order."""
    if size < 1:
        raise ValueError("size must be >= 1")
    out = []
    for start in range(0, len(items) - size + 1, size):
        out.append(list(items[start:start + size]))
    return out


def window(items, size):
    """Sliding windows of `size` consecutive elements."""
    return [tuple(items[i:i + size]) for i in range(len(items) - size + 1)]
''',
        "tests/test_core.py": TEST,
    },
    "fix": {"seqtools/core.py": [("range(0, len(items) - size + 1, size)", "range(0, len(items), size)")]},
    "tests": {
        "tests/test_core.py": TEST
        + """

def test_chunk_keeps_partial_tail():
    assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_chunk_size_larger_than_input():
    assert chunk([1, 2], 5) == [[1, 2]]
"""
    },
}
