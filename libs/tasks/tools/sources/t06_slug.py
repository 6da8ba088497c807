"""Bundled task source (data for build_bundled.py)."""

TEST = """from webtext import slugify


def test_simple():
    assert slugify("Hello World") == "hello-world"


def test_lowercase():
    assert slugify("ABC") == "abc"
"""
TASK = {
    "repo": "floe/webtext",
    "number": 5,
    "created_at": "2026-01-07T11:00:00Z",
    "problem_statement": """slugify leaves repeated and trailing dashes

`slugify("  Hello,   World!  ")` gives `"--hello---world---"`. Slugs should collapse runs of
separators into one dash and never start or end with a dash: expected `"hello-world"`.
""",
    "files": {
        "webtext/__init__.py": "from webtext.slug import slugify\n",
        "webtext/slug.py": '''"""URL slugs."""
import re


def slugify(text):
    return re.sub(r"[^a-z0-9]", "-", text.lower())
''',
        "tests/test_slug.py": TEST,
    },
    "fix": {
        "webtext/slug.py": [
            (
                'return re.sub(r"[^a-z0-9]", "-", text.lower())',
                'return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")',
            )
        ]
    },
    "tests": {
        "tests/test_slug.py": TEST
        + """

def test_collapses_separators():
    assert slugify("  Hello,   World!  ") == "hello-world"


def test_only_punctuation():
    assert slugify("!!!") == ""
"""
    },
}
