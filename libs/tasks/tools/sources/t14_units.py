"""Bundled task source (data for build_bundled.py)."""

TEST = """from unitconv import convert


def test_identity():
    assert convert(3, "m", "m") == 3


def test_km_to_m():
    assert convert(2, "km", "m") == 2000
"""
TASK = {
    "repo": "floe/unitconv",
    "number": 30,
    "created_at": "2026-01-15T10:00:00Z",
    "problem_statement": """convert(): miles are wrong and reverse conversions fail

* `convert(1, "mi", "km")` returns `1.906`; a mile is 1.609344 km.
* `convert(1000, "m", "km")` raises `KeyError: ('m', 'km')` although `km -> m` works. Conversions
  should work in both directions for every pair in the table.
""",
    "files": {
        "unitconv/__init__.py": "from unitconv.core import convert\n",
        "unitconv/tables.py": '''"""Conversion factors: FACTORS[(a, b)] * value_in_a == value_in_b."""

FACTORS = {
    ("km", "m"): 1000.0,
    ("mi", "km"): 1.906,
    ("h", "min"): 60.0,
}
''',
        "unitconv/core.py": '''"""Unit conversion."""
from unitconv.tables import FACTORS


def convert(value, src, dst):
    if src == dst:
        return value
    return value * FACTORS[(src, dst)]
''',
        "tests/test_core.py": TEST,
    },
    "fix": {
        "unitconv/tables.py": [("1.906", "1.609344")],
        "unitconv/core.py": [
            (
                "    return value * FACTORS[(src, dst)]\n",
                "    if (src, dst) in FACTORS:\n        return value * FACTORS[(src, dst)]\n"
                "    if (dst, src) in FACTORS:\n        return value / FACTORS[(dst, src)]\n"
                '    raise KeyError(f"no conversion from {src} to {dst}")\n',
            )
        ],
    },
    "tests": {
        "tests/test_core.py": TEST
        + """

def test_miles():
    assert abs(convert(1, "mi", "km") - 1.609344) < 1e-9


def test_reverse_direction():
    assert convert(1000, "m", "km") == 1
    assert convert(90, "min", "h") == 1.5
"""
    },
}
