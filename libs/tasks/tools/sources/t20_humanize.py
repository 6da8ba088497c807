"""Bundled task source (data for build_bundled.py)."""

TEST = """from datetime import timedelta

from humantime import humanize


def test_seconds():
    assert humanize(timedelta(seconds=45)) == "45 seconds"


def test_minutes():
    assert humanize(timedelta(minutes=5)) == "5 minutes"
"""
TASK = {
    "repo": "floe/humantime",
    "number": 13,
    "created_at": "2026-01-21T10:00:00Z",
    "problem_statement": """humanize() ignores days

`humanize(timedelta(days=2, hours=1))` returns `"1 hours"`. The day part is dropped. Expected
`"2 days"` (largest unit, rounded down), and `humanize(timedelta(days=1))` should say `"1 day"`
(singular); same for `"1 hour"`, `"1 minute"`, `"1 second"`.
""",
    "files": {
        "humantime/__init__.py": "from humantime.delta import humanize\n",
        "humantime/delta.py": '''"""Human-readable durations."""


def humanize(delta):
    secs = delta.seconds
    for unit, size in (("hours", 3600), ("minutes", 60)):
        if secs >= size:
            return f"{secs // size} {unit}"
    return f"{secs} seconds"
''',
        "tests/test_delta.py": TEST,
    },
    "fix": {
        "humantime/delta.py": [
            (
                '    secs = delta.seconds\n    for unit, size in (("hours", 3600), ("minutes", 60)):\n'
                '        if secs >= size:\n            return f"{secs // size} {unit}"\n    return f"{secs} seconds"\n',
                "    secs = int(delta.total_seconds())\n"
                '    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):\n'
                '        if secs >= size or unit == "second":\n            n = secs // size\n'
                '            return f"{n} {unit}" + ("" if n == 1 else "s")\n    raise AssertionError("unreachable")\n',
            )
        ]
    },
    "tests": {
        "tests/test_delta.py": TEST
        + """

def test_days():
    assert humanize(timedelta(days=2, hours=1)) == "2 days"


def test_singular():
    assert humanize(timedelta(days=1)) == "1 day"
    assert humanize(timedelta(hours=1)) == "1 hour"
"""
    },
}
