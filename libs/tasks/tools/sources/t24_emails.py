"""Bundled task source (data for build_bundled.py)."""

TEST = """from scrape import extract_emails


def test_leading_email():
    assert extract_emails("bob@example.com wrote") == ["bob@example.com"]


def test_none():
    assert extract_emails("no address here") == []
"""
TASK = {
    "repo": "floe/scrape",
    "number": 22,
    "created_at": "2026-01-25T10:00:00Z",
    "problem_statement": """extract_emails only finds an address at the very start of the text

`extract_emails("contact: ann@x.org or bob@y.net")` returns `[]`. It only works when the text
begins with an address, and even then returns only the first one. Expected
`["ann@x.org", "bob@y.net"]`, in order of appearance, without duplicates.
""",
    "files": {
        "scrape/__init__.py": "from scrape.emails import extract_emails\n",
        "scrape/emails.py": '''"""Find e-mail addresses in text."""
import re

EMAIL = re.compile(r"[\\w.+-]+@[\\w-]+\\.[\\w.-]+")


def extract_emails(text):
    m = EMAIL.match(text)
    return [m.group(0)] if m else []
''',
        "tests/test_emails.py": TEST,
    },
    "fix": {
        "scrape/emails.py": [
            (
                "    m = EMAIL.match(text)\n    return [m.group(0)] if m else []\n",
                "    return list(dict.fromkeys(EMAIL.findall(text)))\n",
            )
        ]
    },
    "tests": {
        "tests/test_emails.py": TEST
        + """

def test_finds_all_in_order():
    assert extract_emails("contact: ann@x.org or bob@y.net") == ["ann@x.org", "bob@y.net"]


def test_dedupes():
    assert extract_emails("a@b.co a@b.co") == ["a@b.co"]
"""
    },
}
