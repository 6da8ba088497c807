"""Bundled task source (data for build_bundled.py)."""

TEST = """from numerals import roman_to_int


def test_additive():
    assert roman_to_int("III") == 3
    assert roman_to_int("LXVI") == 66
"""
TASK = {
    "repo": "floe/numerals",
    "number": 12,
    "created_at": "2026-01-14T10:00:00Z",
    "problem_statement": """roman_to_int gets subtractive forms wrong

`roman_to_int("IV")` returns 6 and `roman_to_int("MCMXCIV")` returns 2216 (should be 4 and 1994).
A smaller numeral before a larger one must be subtracted. Lower-case input should work too.
""",
    "files": {
        "numerals/__init__.py": "from numerals.roman import roman_to_int\n",
        "numerals/roman.py": '''"""Roman numerals."""

VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_to_int(text):
    return sum(VALUES[ch] for ch in text)
''',
        "tests/test_roman.py": TEST,
    },
    "fix": {
        "numerals/roman.py": [
            (
                "    return sum(VALUES[ch] for ch in text)\n",
                "    vals = [VALUES[ch] for ch in text.upper()]\n    total = 0\n    for i, v in enumerate(vals):\n"
                "        total += -v if i + 1 < len(vals) and vals[i + 1] > v else v\n    return total\n",
            )
        ]
    },
    "tests": {
        "tests/test_roman.py": TEST
        + """

def test_subtractive():
    assert roman_to_int("IV") == 4
    assert roman_to_int("MCMXCIV") == 1994


def test_lowercase():
    assert roman_to_int("xiv") == 14
"""
    },
}
