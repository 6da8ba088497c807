"""Typed identifiers. Ids are chosen by the producer of the first event that names them, so re-publishing
the same event (after a crash, say) is idempotent downstream."""

from __future__ import annotations

import re
import secrets
from typing import NewType

__all__ = ["BatchId", "GroupId", "SessionId", "new_batch_id", "new_group_id", "new_session_id", "valid_id"]

SessionId = NewType("SessionId", str)
GroupId = NewType("GroupId", str)
BatchId = NewType("BatchId", str)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def valid_id(value: str) -> bool:
    """Ids are short, URL-safe and never empty: they appear in URLs, file names and Kafka keys."""
    return bool(_ID_RE.match(value))


def new_session_id() -> SessionId:
    return SessionId("s-" + secrets.token_hex(8))


def new_group_id() -> GroupId:
    return GroupId("g-" + secrets.token_hex(6))


def new_batch_id() -> BatchId:
    return BatchId("b-" + secrets.token_hex(8))
