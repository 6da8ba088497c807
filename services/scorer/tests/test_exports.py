from __future__ import annotations

import types

import scorer


def test_exported_members() -> None:
    public = {n for n, v in vars(scorer).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert set(scorer.__all__) == public
