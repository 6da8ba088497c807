from __future__ import annotations

import types

import sandbox


def test_exported_members() -> None:
    public = {n for n, v in vars(sandbox).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert set(sandbox.__all__) == public
