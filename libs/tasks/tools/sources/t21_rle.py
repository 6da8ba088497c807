"""Bundled task source (data for build_bundled.py)."""

TEST = """from packbits import rle_decode, rle_encode


def test_decode():
    assert rle_decode([("a", 2), ("b", 1)]) == "aab"


def test_encode_empty():
    assert rle_encode("") == []
"""
TASK = {
    "repo": "floe/packbits",
    "number": 3,
    "created_at": "2026-01-22T10:00:00Z",
    "problem_statement": """rle_encode loses the final run

`rle_encode("aaabcc")` returns `[("a", 3), ("b", 1)]`; the trailing `("c", 2)` is missing, so
`rle_decode(rle_encode(s)) != s` for every non-empty string.
""",
    "files": {
        "packbits/__init__.py": "from packbits.rle import rle_decode, rle_encode\n",
        "packbits/rle.py": '''"""Run-length encoding of strings."""


def rle_encode(text):
    runs = []
    if not text:
        return runs
    current, count = text[0], 1
    for ch in text[1:]:
        if ch == current:
            count += 1
        else:
            runs.append((current, count))
            current, count = ch, 1
    return runs


def rle_decode(runs):
    return "".join(ch * n for ch, n in runs)
''',
        "tests/test_rle.py": TEST,
    },
    "fix": {
        "packbits/rle.py": [
            (
                "            current, count = ch, 1\n    return runs\n",
                "            current, count = ch, 1\n    runs.append((current, count))\n    return runs\n",
            )
        ]
    },
    "tests": {
        "tests/test_rle.py": TEST
        + """

def test_encode_keeps_last_run():
    assert rle_encode("aaabcc") == [("a", 3), ("b", 1), ("c", 2)]


def test_roundtrip():
    for s in ["x", "abba", "zzzz"]:
        assert rle_decode(rle_encode(s)) == s
"""
    },
}
