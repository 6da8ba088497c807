"""Bundled task source (data for build_bundled.py)."""

TEST = """from semverish import compare, parse


def test_parse():
    assert parse("1.2.3") == (1, 2, 3)


def test_equal():
    assert compare("1.0", "1.0") == 0
"""
TASK = {
    "repo": "floe/semverish",
    "number": 9,
    "created_at": "2026-01-11T10:00:00Z",
    "problem_statement": """compare("1.10", "1.9") says 1.10 is older

Version comparison is done on the strings, so `compare("1.10", "1.9")` returns `-1` and
`compare("2.0", "10.0")` returns `1`. Components must be compared numerically; missing components
count as zero (`compare("1.0", "1") == 0`).
""",
    "files": {
        "semverish/__init__.py": "from semverish.version import compare, parse\n",
        "semverish/version.py": '''"""Dotted version strings."""


def parse(text):
    return tuple(int(p) for p in text.split("."))


def compare(a, b):
    """-1 if a < b, 0 if equal, 1 if a > b."""
    if a == b:
        return 0
    return -1 if a < b else 1
''',
        "tests/test_version.py": TEST,
    },
    "fix": {
        "semverish/version.py": [
            (
                "    if a == b:\n        return 0\n    return -1 if a < b else 1\n",
                "    pa, pb = list(parse(a)), list(parse(b))\n    width = max(len(pa), len(pb))\n"
                "    pa += [0] * (width - len(pa))\n    pb += [0] * (width - len(pb))\n"
                "    if pa == pb:\n        return 0\n    return -1 if pa < pb else 1\n",
            )
        ]
    },
    "tests": {
        "tests/test_version.py": TEST
        + """

def test_numeric_components():
    assert compare("1.10", "1.9") == 1
    assert compare("2.0", "10.0") == -1


def test_missing_components_are_zero():
    assert compare("1.0", "1") == 0
"""
    },
}
