# ruff: noqa: E501
"""Bundled task source (data for build_bundled.py)."""

TEST = """from retrying import retry


def test_succeeds_after_failures():
    calls = []

    @retry(times=3)
    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("boom")
        return "ok"

    assert flaky() == "ok"
    assert len(calls) == 3
"""
TASK = {
    "repo": "floe/retrying",
    "number": 25,
    "created_at": "2026-01-18T10:00:00Z",
    "problem_statement": """retry() should only retry the listed exceptions

`@retry(times=3)` retries on *every* exception, including `KeyboardInterrupt`-style bugs like
`TypeError` from a wrong call. Please add an `on=` parameter (a tuple of exception types, default
`(Exception,)`); other exceptions must propagate immediately without retrying. Also, after the last
attempt the original exception should be raised (today a bare `RuntimeError("gave up")` hides it).
""",
    "files": {
        "retrying/__init__.py": "from retrying.deco import retry\n",
        "retrying/deco.py": '''"""Retry decorator (no sleeping: callers add backoff themselves)."""
import functools


def retry(times=3):
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            for _ in range(times):
                try:
                    return fn(*args, **kwargs)
                except Exception:
                    continue
            raise RuntimeError("gave up")

        return inner

    return wrap
''',
        "tests/test_deco.py": TEST,
    },
    "fix": {
        "retrying/deco.py": [
            ("def retry(times=3):", "def retry(times=3, on=(Exception,)):"),
            (
                "            for _ in range(times):\n                try:\n                    return fn(*args, **kwargs)\n"
                '                except Exception:\n                    continue\n            raise RuntimeError("gave up")\n',
                "            for attempt in range(times):\n                try:\n                    return fn(*args, **kwargs)\n"
                "                except on:\n                    if attempt == times - 1:\n                        raise\n"
                '            raise ValueError("times must be >= 1")\n',
            ),
        ]
    },
    "tests": {
        "tests/test_deco.py": TEST
        + """

def test_other_exceptions_propagate_immediately():
    import pytest

    calls = []

    @retry(times=5, on=(ValueError,))
    def bad():
        calls.append(1)
        raise TypeError("wrong call")

    with pytest.raises(TypeError):
        bad()
    assert len(calls) == 1


def test_last_exception_is_raised():
    import pytest

    @retry(times=2)
    def always():
        raise KeyError("missing")

    with pytest.raises(KeyError):
        always()
"""
    },
}
