"""Errors raised while encoding or decoding floe wire contracts.

Tree::

    ContractError                 root: anything wrong with a message on the wire
    ├── DecodeError               bytes are not a valid event of the topic's type
    ├── SchemaVersionError        the message was written by a newer (or unknown) contract version
    ├── PromptDeltaError          a delta-encoded prompt cannot be rebuilt from the session's other calls
    └── RequestDeltaError         a delta-encoded request cannot be rebuilt from the session's other calls

Consumers treat ``DecodeError`` and ``SchemaVersionError`` as *poison*: the message goes to the dead-letter topic
with the reason, and the consumer carries on. A newer ``schema_version`` is never read silently with an older model.
``PromptDeltaError`` and ``RequestDeltaError`` are about a session's calls taken together, not one message: each
record decoded fine, so nothing is dead-lettered (the rollout masks the session instead).
"""

from __future__ import annotations

__all__ = ["ContractError", "DecodeError", "PromptDeltaError", "RequestDeltaError", "SchemaVersionError"]


class ContractError(Exception):
    """Root of every contract error."""


class DecodeError(ContractError):
    """The payload is not valid JSON/Arrow, or does not match the event model."""


class SchemaVersionError(ContractError):
    """The payload's ``schema_version`` is not one this build understands."""

    def __init__(self, event_type: str, got: object, supported: int) -> None:
        super().__init__(f"{event_type}: schema_version {got!r} is not supported (this build reads <= {supported})")
        self.event_type = event_type
        self.got = got
        self.supported = supported


class PromptDeltaError(ContractError):
    """A ``ModelCallRecorded`` prompt refers to a base call that was not given, or does not fit it
    (``contracts.prompt_delta``)."""


class RequestDeltaError(ContractError):
    """A ``ModelCallRecorded`` request refers to a base call that was not given, or does not fit it
    (``contracts.request_delta``)."""
