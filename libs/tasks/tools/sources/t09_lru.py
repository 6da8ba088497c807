"""Bundled task source (data for build_bundled.py)."""

TEST = """from memo import LRUCache


def test_put_get():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1


def test_eviction_oldest():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("c", 3)
    assert c.get("a") is None
    assert len(c) == 2
"""
TASK = {
    "repo": "floe/memo",
    "number": 4,
    "created_at": "2026-01-10T10:00:00Z",
    "problem_statement": """LRUCache evicts recently read entries

The cache is documented as least-*recently-used*, but reading a key does not count as a use:

```python
c = LRUCache(2); c.put("a", 1); c.put("b", 2)
c.get("a"); c.put("c", 3)
c.get("a")  # None, expected 1 ("b" should have been evicted)
```
""",
    "files": {
        "memo/__init__.py": "from memo.lru import LRUCache\n",
        "memo/lru.py": '''"""A small LRU cache."""
from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key, default=None):
        return self._data.get(key, default)

    def put(self, key, value):
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self):
        return len(self._data)
''',
        "tests/test_lru.py": TEST,
    },
    "fix": {
        "memo/lru.py": [
            (
                "        return self._data.get(key, default)\n",
                "        if key not in self._data:\n            return default\n"
                "        self._data.move_to_end(key)\n        return self._data[key]\n",
            )
        ]
    },
    "tests": {
        "tests/test_lru.py": TEST
        + """

def test_get_refreshes_recency():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert c.get("a") == 1
    assert c.get("b") is None
"""
    },
}
