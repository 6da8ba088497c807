"""Bundled task source (data for build_bundled.py)."""

TEST = """from cfgmerge import deep_merge


def test_flat_override():
    assert deep_merge({"a": 1}, {"a": 2, "b": 3}) == {"a": 2, "b": 3}


def test_nested_merge():
    assert deep_merge({"x": {"a": 1}}, {"x": {"b": 2}}) == {"x": {"a": 1, "b": 2}}
"""
TASK = {
    "repo": "floe/cfgmerge",
    "number": 21,
    "created_at": "2026-01-09T10:00:00Z",
    "problem_statement": """deep_merge modifies its first argument

```python
defaults = {"db": {"host": "localhost"}}
cfg = deep_merge(defaults, {"db": {"port": 5432}})
defaults  # {'db': {'host': 'localhost', 'port': 5432}}  <- changed!
```

Merging the same defaults into several configs leaks settings between them. `deep_merge` should
return a new structure and leave both inputs untouched.
""",
    "files": {
        "cfgmerge/__init__.py": "from cfgmerge.merge import deep_merge\n",
        "cfgmerge/merge.py": '''"""Recursive dict merge (right wins)."""


def deep_merge(base, override):
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key].update(deep_merge(result[key], value))
        else:
            result[key] = value
    return result
''',
        "tests/test_merge.py": TEST,
    },
    "fix": {
        "cfgmerge/merge.py": [
            ("result[key].update(deep_merge(result[key], value))", "result[key] = deep_merge(result[key], value)")
        ]
    },
    "tests": {
        "tests/test_merge.py": TEST
        + """

def test_inputs_not_mutated():
    defaults = {"db": {"host": "localhost"}}
    deep_merge(defaults, {"db": {"port": 5432}})
    assert defaults == {"db": {"host": "localhost"}}
"""
    },
}
