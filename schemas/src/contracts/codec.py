"""Bytes <-> events. The only place that knows how an event is laid out on the wire.

Every event is UTF-8 JSON, except that a ``TrajectoryBatch`` or ``GroupAssembled`` with an inline Arrow payload is
*framed*:
``b"FLOE" + u32 header length (big endian) + JSON header + Arrow IPC stream``. The Arrow bytes are returned as a
zero-copy ``memoryview`` slice of the message, so the learner can open them without copying.

Decoding checks ``schema_version`` *before* validating the model: a message from a newer producer raises
``SchemaVersionError`` instead of being mis-read by an older model. Older versions an event still reads
(``Event.READS``) are upgraded by the model itself (a ``mode="before"`` validator), so ``model_validate`` on a
replayed JSONL line reads them too.
"""

from __future__ import annotations

import json
import struct
from typing import Any, TypeVar

from pydantic import ValidationError

from contracts.errors import DecodeError, SchemaVersionError
from contracts.events import Event, GroupAssembled, TrajectoryBatch

__all__ = ["decode", "encode"]

E = TypeVar("E", bound=Event)

_MAGIC = b"FLOE"
_HEADER = struct.Struct(">I")
# Events whose inline Arrow payload travels after the JSON header instead of inside it.
_FRAMED = (TrajectoryBatch, GroupAssembled)


def encode(event: Event) -> bytes:
    header = event.model_dump_json().encode()
    if isinstance(event, _FRAMED) and event.arrow_ipc is not None:
        return _MAGIC + _HEADER.pack(len(header)) + header + event.arrow_ipc
    return header


def decode(model: type[E], data: bytes | memoryview) -> E:
    """Decode ``data`` as an event of ``model``; raise ``DecodeError`` or ``SchemaVersionError``."""
    view = memoryview(data)
    payload: bytes | memoryview | None = None
    if bytes(view[:4]) == _MAGIC:
        if len(view) < 8:
            raise DecodeError(f"{model.__name__}: truncated frame")
        (n,) = _HEADER.unpack(view[4:8])
        header = bytes(view[8 : 8 + n])
        payload = view[8 + n :]
        if len(header) != n:
            raise DecodeError(f"{model.__name__}: truncated frame header")
    else:
        header = bytes(view)
    try:
        raw: Any = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DecodeError(f"{model.__name__}: not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise DecodeError(f"{model.__name__}: expected a JSON object, got {type(raw).__name__}")
    version = raw.get("schema_version")
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or (version != model.SCHEMA_VERSION and version not in model.READS)
    ):
        raise SchemaVersionError(model.__name__, version, model.SCHEMA_VERSION)
    if payload is not None:
        if model not in _FRAMED:
            raise DecodeError(f"{model.__name__}: unexpected binary frame")
        raw["arrow_ipc"] = payload
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise DecodeError(f"{model.__name__}: {exc.error_count()} invalid field(s): {_short(exc)}") from exc


def _short(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
