# ruff: noqa: E501
"""Bundled task source (data for build_bundled.py)."""

TEST = """from invoicer import Line, render_total


def test_single_line():
    assert render_total([Line("pen", 2, 150)]) == "3.00"
"""
TASK = {
    "repo": "floe/invoicer",
    "number": 8,
    "created_at": "2026-01-16T10:00:00Z",
    "problem_statement": """Discounts ignored and totals print too many decimals

Two problems with invoice totals:

1. `Line.total()` ignores `discount_pct`: `Line("pen", 1, 1000, discount_pct=10).total()` is `1000`
   instead of `900` (amounts are integer cents; round half up to whole cents).
2. `render_total` prints `"10.5"` for 1050 cents; it should always show two decimals: `"10.50"`.
""",
    "files": {
        "invoicer/__init__.py": "from invoicer.models import Line\nfrom invoicer.report import render_total\n",
        "invoicer/models.py": '''"""Invoice lines; money is integer cents."""
from dataclasses import dataclass


@dataclass
class Line:
    name: str
    qty: int
    unit_cents: int
    discount_pct: int = 0

    def total(self):
        return self.qty * self.unit_cents
''',
        "invoicer/report.py": '''"""Rendering."""


def render_total(lines):
    cents = sum(line.total() for line in lines)
    return str(cents / 100)
''',
        "tests/test_invoice.py": TEST,
    },
    "fix": {
        "invoicer/models.py": [
            (
                "        return self.qty * self.unit_cents\n",
                "        gross = self.qty * self.unit_cents\n        return (gross * (100 - self.discount_pct) + 50) // 100\n",
            )
        ],
        "invoicer/report.py": [("    return str(cents / 100)\n", '    return f"{cents // 100}.{cents % 100:02d}"\n')],
    },
    "tests": {
        "tests/test_invoice.py": TEST
        + """

def test_discount():
    assert Line("pen", 1, 1000, discount_pct=10).total() == 900
    assert Line("x", 1, 5, discount_pct=50).total() == 3


def test_two_decimals():
    assert render_total([Line("a", 1, 1050)]) == "10.50"
    assert render_total([Line("a", 1, 7)]) == "0.07"
"""
    },
}
