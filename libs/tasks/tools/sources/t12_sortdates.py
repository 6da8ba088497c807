"""Bundled task source (data for build_bundled.py)."""

TEST = """from eventlog import Event, latest


def test_latest():
    evs = [Event("a", "2026-01-02"), Event("b", "2026-03-01")]
    assert latest(evs).name == "b"
"""
TASK = {
    "repo": "floe/eventlog",
    "number": 6,
    "created_at": "2026-01-13T10:00:00Z",
    "problem_statement": """sort_events returns None

`eventlog.sort_events(events)` always returns `None`, so `for e in sort_events(evs)` raises
`TypeError: 'NoneType' object is not iterable`. It should return a new list sorted by date
(oldest first) and must not reorder the caller's list.
""",
    "files": {
        "eventlog/__init__.py": "from eventlog.events import Event, latest, sort_events\n",
        "eventlog/events.py": '''"""Dated events."""
from dataclasses import dataclass


@dataclass
class Event:
    name: str
    date: str  # ISO yyyy-mm-dd


def sort_events(events):
    return events.sort(key=lambda e: e.date)


def latest(events):
    return max(events, key=lambda e: e.date)
''',
        "tests/test_events.py": TEST,
    },
    "fix": {
        "eventlog/events.py": [
            ("return events.sort(key=lambda e: e.date)", "return sorted(events, key=lambda e: e.date)")
        ]
    },
    "tests": {
        "tests/test_events.py": TEST
        + """

def test_sort_events_returns_sorted_copy():
    from eventlog import sort_events

    evs = [Event("b", "2026-03-01"), Event("a", "2026-01-02")]
    out = sort_events(evs)
    assert [e.name for e in out] == ["a", "b"]
    assert [e.name for e in evs] == ["b", "a"]
"""
    },
}
