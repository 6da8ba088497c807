"""Bundled task source (data for build_bundled.py)."""

TEST = """from pager import page_count, paginate


def test_page_count():
    assert page_count(10, 3) == 4
    assert page_count(0, 3) == 0


def test_page_beyond_end_is_empty():
    assert paginate(list(range(5)), 9, 2) == []
"""
TASK = {
    "repo": "floe/pager",
    "number": 3,
    "created_at": "2026-01-03T09:00:00Z",
    "problem_statement": """paginate(): page 1 skips the first items

Pages are documented as 1-based, but `paginate(list(range(10)), 1, 3)` returns `[3, 4, 5]` instead of
`[0, 1, 2]`. Every page is shifted by one page, and the first page of results can never be reached.
""",
    "files": {
        "pager/__init__.py": "from pager.pages import page_count, paginate\n",
        "pager/pages.py": '''"""1-based pagination over a list."""


def page_count(total, per_page):
    return (total + per_page - 1) // per_page


def paginate(items, page, per_page):
    """Items on `page` (1-based) with `per_page` items per page."""
    if page < 1:
        raise ValueError("page is 1-based")
    start = page * per_page
    return items[start:start + per_page]
''',
        "tests/test_pages.py": TEST,
    },
    "fix": {"pager/pages.py": [("start = page * per_page", "start = (page - 1) * per_page")]},
    "tests": {
        "tests/test_pages.py": TEST
        + """

def test_first_page():
    assert paginate(list(range(10)), 1, 3) == [0, 1, 2]


def test_last_partial_page():
    assert paginate(list(range(10)), 4, 3) == [9]
"""
    },
}
