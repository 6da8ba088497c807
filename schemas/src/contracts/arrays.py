"""Compact wire form of token ids and logprobs inside JSON events (``ModelCallRecorded`` v2).

A JSON list spends 6-7 bytes on a 5-digit token id and up to 22 on a float64 logprob, and pydantic has to build and
check a Python object per element. On the wire each array is instead one string: a tag, a colon and the base64 of
the little-endian machine array::

    "u2:<base64>"   token ids, all < 65536 (uint16: 2.7 characters per id)
    "u4:<base64>"   token ids up to 2**32 - 1 (uint32)
    "f4:<base64>"   logprobs that float32 holds exactly (what engines compute: vLLM and our CPU engine sample in fp32)
    "f8:<base64>"   any other logprobs (float64: lossless for every Python float)

The narrowest lossless form is chosen per array, so decoding gives back exactly the values that were encoded: a
sampled token's id and its sampling logprob are never rounded. Readers also accept plain JSON lists (v1 records,
hand-written fixtures). Encoding and decoding are C loops (``array`` and ``binascii``), not per-element Python.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from collections.abc import Sequence
from typing import Any

__all__ = ["decode_floats", "decode_ints", "encode_floats", "encode_ints"]

_LITTLE = sys.byteorder == "little"
_INT_CODES = {"u2": "H", "u4": "I"}
_FLOAT_CODES = {"f4": "f", "f8": "d"}
# array's "I" is 4 bytes on every platform CPython supports, but say so rather than assume it.
assert array("H").itemsize == 2 and array("I").itemsize == 4 and array("f").itemsize == 4


def _pack(arr: array[Any]) -> str:
    if not _LITTLE:
        arr.byteswap()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def _unpack(code: str, text: str) -> array[Any]:
    arr = array(code)
    try:
        arr.frombytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not a {code!r} array: {exc}") from exc
    if not _LITTLE:
        arr.byteswap()
    return arr


def encode_ints(values: Sequence[int]) -> str:
    """Token ids as ``u2:`` or ``u4:``; raise ``ValueError`` for an id outside ``[0, 2**32)``."""
    if not values:
        return "u2:"
    top = max(values)
    if min(values) < 0 or top >= 1 << 32:
        raise ValueError("token ids must be in [0, 2**32)")
    tag = "u2" if top < 1 << 16 else "u4"
    return f"{tag}:{_pack(array(_INT_CODES[tag], values))}"


def encode_floats(values: Sequence[float]) -> str:
    """Logprobs as ``f4:`` when float32 holds every value exactly (one C-level list comparison decides), else
    ``f8:`` (a NaN, never equal to itself, also takes this lossless path)."""
    narrow = array("f", values)
    if narrow.tolist() == list(values):
        return f"f4:{_pack(narrow)}"
    return f"f8:{_pack(array('d', values))}"


def decode_ints(value: Any) -> Any:
    """A ``u2:``/``u4:`` string -> list of ints; anything else is returned for pydantic to validate (a v1 list)."""
    if not isinstance(value, str):
        return value
    tag, sep, body = value.partition(":")
    code = _INT_CODES.get(tag)
    if not sep or code is None:
        raise ValueError(f"token ids: unknown encoding {tag!r} (expected u2: or u4:)")
    return _unpack(code, body).tolist()


def decode_floats(value: Any) -> Any:
    """A ``f4:``/``f8:`` string -> list of floats; anything else is returned for pydantic to validate."""
    if not isinstance(value, str):
        return value
    tag, sep, body = value.partition(":")
    code = _FLOAT_CODES.get(tag)
    if not sep or code is None:
        raise ValueError(f"logprobs: unknown encoding {tag!r} (expected f4: or f8:)")
    return _unpack(code, body).tolist()
