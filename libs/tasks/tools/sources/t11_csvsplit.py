"""Bundled task source (data for build_bundled.py)."""

TEST = """from rowparse import split_row


def test_plain():
    assert split_row("a,b,c") == ["a", "b", "c"]


def test_empty_fields():
    assert split_row("a,,c") == ["a", "", "c"]
"""
TASK = {
    "repo": "floe/rowparse",
    "number": 17,
    "created_at": "2026-01-12T10:00:00Z",
    "problem_statement": '''split_row breaks quoted fields that contain commas

`split_row('1,"Smith, John",x')` returns `['1', '"Smith', ' John"', 'x']`.
Fields wrapped in double quotes should be kept whole (without the quotes), and a doubled quote
inside a quoted field is a literal quote: `split_row('"say ""hi""",2')` -> `['say "hi"', '2']`.
Please don't pull in the csv module; this library must stay dependency-free and tiny.
''',
    "files": {
        "rowparse/__init__.py": "from rowparse.split import split_row\n",
        "rowparse/split.py": '''"""Split one comma-separated line."""


def split_row(line):
    return line.split(",")
''',
        "tests/test_split.py": TEST,
    },
    "fix": {
        "rowparse/split.py": [
            (
                '    return line.split(",")\n',
                """    fields, buf, quoted, i = [], [], False, 0
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == '"' and i + 1 < len(line) and line[i + 1] == '"':
                buf.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                buf.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == ",":
            fields.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    fields.append("".join(buf))
    return fields
""",
            )
        ]
    },
    "tests": {
        "tests/test_split.py": TEST
        + '''

def test_quoted_comma():
    assert split_row('1,"Smith, John",x') == ["1", "Smith, John", "x"]


def test_escaped_quote():
    assert split_row('"say ""hi""",2') == ['say "hi"', "2"]
'''
    },
}
