"""Bundled task source (data for build_bundled.py)."""

TEST = """from tinymat import Matrix


def test_shape():
    assert Matrix([[1, 2, 3], [4, 5, 6]]).shape == (2, 3)


def test_add():
    assert (Matrix([[1]]) + Matrix([[2]])).rows == [[3]]
"""
TASK = {
    "repo": "floe/tinymat",
    "number": 19,
    "created_at": "2026-01-17T10:00:00Z",
    "problem_statement": """Feature request: Matrix.transpose() and matrix multiplication

`tinymat.Matrix` has no way to transpose or multiply. Please add:

* `m.transpose()` returning a new `Matrix` (rows become columns);
* `a @ b` (matrix product) raising `ValueError` when the inner dimensions differ.
""",
    "files": {
        "tinymat/__init__.py": "from tinymat.matrix import Matrix\n",
        "tinymat/matrix.py": '''"""A tiny dense matrix."""


class Matrix:
    def __init__(self, rows):
        self.rows = [list(r) for r in rows]

    @property
    def shape(self):
        return (len(self.rows), len(self.rows[0]) if self.rows else 0)

    def __add__(self, other):
        return Matrix([[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(self.rows, other.rows)])
''',
        "tests/test_matrix.py": TEST,
    },
    "fix": {
        "tinymat/matrix.py": [
            (
                "        return Matrix([[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(self.rows, other.rows)])\n",
                "        return Matrix([[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(self.rows, other.rows)])\n\n"
                "    def transpose(self):\n        return Matrix([list(col) for col in zip(*self.rows)])\n\n"
                "    def __matmul__(self, other):\n        if self.shape[1] != other.shape[0]:\n"
                '            raise ValueError("inner dimensions differ")\n        cols = other.transpose().rows\n'
                "        return Matrix([[sum(a * b for a, b in zip(r, c)) for c in cols] for r in self.rows])\n",
            )
        ]
    },
    "tests": {
        "tests/test_matrix.py": TEST
        + """

def test_transpose():
    assert Matrix([[1, 2, 3], [4, 5, 6]]).transpose().rows == [[1, 4], [2, 5], [3, 6]]


def test_matmul():
    a = Matrix([[1, 2], [3, 4]])
    assert (a @ Matrix([[5], [6]])).rows == [[17], [39]]


def test_matmul_shape_mismatch():
    import pytest

    with pytest.raises(ValueError):
        Matrix([[1, 2]]) @ Matrix([[1, 2]])
"""
    },
}
