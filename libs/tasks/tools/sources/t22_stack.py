# ruff: noqa: E501
"""Bundled task source (data for build_bundled.py)."""

TEST = """from containers import Stack


def test_push_pop():
    s = Stack()
    s.push(1)
    s.push(2)
    assert s.pop() == 2
    assert len(s) == 1
"""
TASK = {
    "repo": "floe/containers",
    "number": 31,
    "created_at": "2026-01-23T10:00:00Z",
    "problem_statement": """Stack.pop() on an empty stack returns None

Popping an empty `Stack` returns `None`, which is indistinguishable from a pushed `None`. Please raise
a dedicated `containers.EmptyStackError` (a subclass of `IndexError`, so existing `except IndexError`
handlers keep working) from both `pop()` and `peek()`.
""",
    "files": {
        "containers/__init__.py": 'from containers.stack import Stack\n\n__all__ = ["Stack"]\n',
        "containers/stack.py": '''"""A LIFO stack."""


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            return None
        return self._items.pop()

    def peek(self):
        return self._items[-1] if self._items else None

    def __len__(self):
        return len(self._items)
''',
        "tests/test_stack.py": TEST,
    },
    "fix": {
        "containers/errors.py": '"""Errors."""\n\n\nclass EmptyStackError(IndexError):\n    """pop() or peek() on an empty stack."""\n',
        "containers/__init__.py": [
            (
                'from containers.stack import Stack\n\n__all__ = ["Stack"]\n',
                'from containers.errors import EmptyStackError\nfrom containers.stack import Stack\n\n__all__ = ["EmptyStackError", "Stack"]\n',
            )
        ],
        "containers/stack.py": [
            ('"""A LIFO stack."""\n', '"""A LIFO stack."""\nfrom containers.errors import EmptyStackError\n'),
            (
                "        if not self._items:\n            return None\n        return self._items.pop()\n",
                '        if not self._items:\n            raise EmptyStackError("pop from empty stack")\n        return self._items.pop()\n',
            ),
            (
                "        return self._items[-1] if self._items else None\n",
                '        if not self._items:\n            raise EmptyStackError("peek at empty stack")\n        return self._items[-1]\n',
            ),
        ],
    },
    "tests": {
        "tests/test_stack.py": TEST,
        "tests/test_empty.py": """import pytest

from containers import EmptyStackError, Stack


def test_pop_empty_raises():
    with pytest.raises(EmptyStackError):
        Stack().pop()


def test_is_index_error():
    with pytest.raises(IndexError):
        Stack().peek()


def test_push_none_then_pop():
    s = Stack()
    s.push(None)
    assert s.pop() is None
""",
    },
}
