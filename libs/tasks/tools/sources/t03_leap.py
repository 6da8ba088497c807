"""Bundled task source (data for build_bundled.py)."""

TEST = """from calx import days_in_month, is_leap


def test_common_years():
    assert not is_leap(2023)
    assert is_leap(2024)


def test_days_in_month_plain():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 4) == 30
"""
TASK = {
    "repo": "floe/calx",
    "number": 7,
    "created_at": "2026-01-04T12:00:00Z",
    "problem_statement": """is_leap(1900) returns True

Century years are only leap years when divisible by 400. `calx.is_leap(1900)` returns `True` and
`calx.days_in_month(2100, 2)` returns 29. 2000 is (correctly) a leap year.
""",
    "files": {
        "calx/__init__.py": "from calx.dates import days_in_month, is_leap\n",
        "calx/dates.py": '''"""Gregorian calendar helpers."""

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    return year % 4 == 0 or year % 400 == 0


def days_in_month(year, month):
    if month == 2 and is_leap(year):
        return 29
    return _DAYS[month - 1]
''',
        "tests/test_dates.py": TEST,
    },
    "fix": {
        "calx/dates.py": [
            ("year % 4 == 0 or year % 400 == 0", "(year % 4 == 0 and year % 100 != 0) or year % 400 == 0")
        ]
    },
    "tests": {
        "tests/test_dates.py": TEST
        + """

def test_century_years():
    assert not is_leap(1900)
    assert is_leap(2000)


def test_february_2100():
    assert days_in_month(2100, 2) == 28
"""
    },
}
