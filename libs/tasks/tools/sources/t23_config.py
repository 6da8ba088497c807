"""Bundled task source (data for build_bundled.py)."""

TEST = """from iniloader import load


def test_plain_values():
    assert load("name=demo\\nport=8080") == {"name": "demo", "port": 8080}


def test_comments_ignored():
    assert load("# hi\\nx=1") == {"x": 1}
"""
TASK = {
    "repo": "floe/iniloader",
    "number": 15,
    "created_at": "2026-01-24T10:00:00Z",
    "problem_statement": """debug = false is loaded as True, and spaces around = break keys

```
debug = false
```

`load()` returns `{"debug ": True}`: the key keeps its trailing space and the string `" false"` is
treated as truthy. Keys and values should be stripped, and `true/false/yes/no/on/off` (any case)
should become booleans.
""",
    "files": {
        "iniloader/__init__.py": "from iniloader.loader import load\n",
        "iniloader/coerce.py": '''"""Turn raw strings into Python values."""


def coerce(raw):
    if raw.isdigit():
        return int(raw)
    if raw.lower() in ("true", "false"):
        return bool(raw)
    return raw
''',
        "iniloader/loader.py": '''"""key=value loader."""
from iniloader.coerce import coerce


def load(text):
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key] = coerce(value)
    return out
''',
        "tests/test_loader.py": TEST,
    },
    "fix": {
        "iniloader/coerce.py": [
            (
                '    if raw.lower() in ("true", "false"):\n        return bool(raw)\n',
                '    if raw.lower() in ("true", "yes", "on"):\n        return True\n'
                '    if raw.lower() in ("false", "no", "off"):\n        return False\n',
            )
        ],
        "iniloader/loader.py": [
            ("        out[key] = coerce(value)\n", "        out[key.strip()] = coerce(value.strip())\n")
        ],
    },
    "tests": {
        "tests/test_loader.py": TEST
        + """

def test_spaces_and_bools():
    assert load("debug = false\\nverbose=YES") == {"debug": False, "verbose": True}


def test_off_is_false():
    assert load("x=off") == {"x": False}
"""
    },
}
