"""Every event that crosses a floe process.

Each event is a frozen pydantic model with ``extra="forbid"`` and a ``schema_version``. Its docstring names who
produces it and who consumes it. Bumping a model's ``SCHEMA_VERSION`` is a contract change: add a golden sample,
and keep readers of the old version working or say why not.

Flow (topics in ``contracts.topics``)::

    rollout ──SessionRequested──▶ gateway nodes ──SessionStateChanged/SessionFinished──▶ rollout, scorer
    rollout ──SessionCancelRequested──▶ gateway nodes
    gateway ──ModelCallRecorded──▶ rollout
    scorer  ──RewardPublished──▶ rollout
    rollout ──TrajectoryBatch──▶ learner
    learner ──WeightsPublished──▶ inference engines, gateway, rollout
"""

from __future__ import annotations

import enum
import time
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

from contracts.arrays import decode_floats, decode_ints, encode_floats, encode_ints
from contracts.providers import Protocol  # kept with the provider descriptions (one home per provider API)

__all__ = [
    "TERMINAL_STATES",
    "VALID_TRANSITIONS",
    "CallTimings",
    "DeadLetter",
    "Event",
    "FinishReason",
    "ModelCallRecorded",
    "Outcome",
    "Protocol",
    "RewardPublished",
    "SamplingPolicy",
    "SessionCancelRequested",
    "SessionFinished",
    "SessionKind",
    "SessionRequested",
    "SessionState",
    "SessionStateChanged",
    "TokenizationMode",
    "TrajectoryBatch",
    "WeightsPublished",
    "now_ms",
]


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (the unit of every ``*_at`` field)."""
    return time.time_ns() // 1_000_000


class Event(BaseModel):
    """Base of every wire event: frozen, strict about unknown fields, versioned."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    SCHEMA_VERSION: ClassVar[int] = 1
    # Versions this build decodes: the current one, plus older ones the model upgrades on validation.
    READS: ClassVar[frozenset[int]] = frozenset({1})
    schema_version: int = 1

    @model_validator(mode="after")
    def _known_version(self) -> Event:
        # Defence in depth: contracts.codec checks the version before validation, so a newer message yields a
        # SchemaVersionError; this catches a model built in code with a version we do not write.
        if self.schema_version != type(self).SCHEMA_VERSION:
            raise ValueError(f"schema_version must be {type(self).SCHEMA_VERSION}, got {self.schema_version}")
        return self


# --------------------------------------------------------------------------------------------------- sessions


class SessionKind(enum.StrEnum):
    TRAIN = "train"
    EVAL = "eval"


class TokenizationMode(enum.StrEnum):
    """How the gateway turns a harness request into engine input.

    ``canonical``: send messages, the engine renders the chat template (Polar's behaviour).
    ``exact``: token-in/token-out; a request that extends the previous call's conversation is sent as the previous
    prompt ids + previously *sampled* ids + the tokens of the new tail, so the model is conditioned on exactly what
    the trainer will see.
    """

    CANONICAL = "canonical"
    EXACT = "exact"


class SamplingPolicy(BaseModel):
    """Sampling parameters enforced by the gateway for training sessions (the harness's own are recorded but
    overridden). ``None`` means "leave the harness's value"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float | None = Field(default=1.0, ge=0.0, le=5.0)
    top_p: float | None = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None


class SessionRequested(Event):
    """Run one harness on one task: one GRPO sample.

    Producer: rollout scheduler. Consumer: gateway nodes (one consumer group; adding a node adds capacity).
    ``session_id`` is chosen by the producer, so a redelivered request never starts a second session.
    """

    session_id: str
    group_id: str
    task_id: str
    task_source: str = Field(default="bundled", description="task set name or URI the gateway node resolves")
    harness: str = Field(description="harness preset name, e.g. 'pi', 'codex', 'command'")
    kind: SessionKind = SessionKind.TRAIN
    priority: int = Field(default=0, ge=0, le=100, description="eval runs use 100 and jump the PREPARING queue")
    sampling: SamplingPolicy = SamplingPolicy()
    tokenization: TokenizationMode = TokenizationMode.EXACT
    agent_timeout_s: float = Field(default=600.0, gt=0)
    session_timeout_s: float = Field(default=1800.0, gt=0)
    policy_version: int = Field(default=0, ge=0, description="learner version when the request was admitted")
    rollout_step: int = Field(default=0, ge=0)
    model: str = Field(default="floe-policy", description="model name presented to the harness")
    requested_at: int = Field(default_factory=now_ms)
    metadata: dict[str, str] = Field(default_factory=dict)


class SessionCancelRequested(Event):
    """Stop a session at whatever stage it is in, and clean up (straggler cut-off, group deadline, operator).

    Producer: rollout scheduler (or ``floe`` CLI). Consumer: every gateway node (each reads the whole topic).
    """

    session_id: str
    group_id: str | None = None
    reason: str
    requested_at: int = Field(default_factory=now_ms)


class SessionState(enum.StrEnum):
    REQUESTED = "REQUESTED"
    PREPARING = "PREPARING"
    READY = "READY"
    RUNNING = "RUNNING"
    FINISHING = "FINISHING"
    DONE = "DONE"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"


TERMINAL_STATES: frozenset[SessionState] = frozenset(
    {SessionState.DONE, SessionState.FAILED, SessionState.TIMEOUT, SessionState.CANCELLED}
)

_ENDINGS = {SessionState.FAILED, SessionState.TIMEOUT, SessionState.CANCELLED}

VALID_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.REQUESTED: frozenset({SessionState.PREPARING} | _ENDINGS),
    SessionState.PREPARING: frozenset({SessionState.READY} | _ENDINGS),
    SessionState.READY: frozenset({SessionState.RUNNING} | _ENDINGS),
    SessionState.RUNNING: frozenset({SessionState.FINISHING} | _ENDINGS),
    # A timeout or cancel during FINISHING still ends the session; DONE only from FINISHING.
    SessionState.FINISHING: frozenset({SessionState.DONE} | _ENDINGS),
    SessionState.DONE: frozenset(),
    SessionState.FAILED: frozenset(),
    SessionState.TIMEOUT: frozenset(),
    SessionState.CANCELLED: frozenset(),
}


class SessionStateChanged(Event):
    """One lifecycle transition of a session, in ``VALID_TRANSITIONS``.

    Producer: the gateway node that runs the session. Consumers: rollout (scheduling, dashboard), operators.
    ``seq`` increases by one per transition of a session, so consumers can drop duplicates.
    """

    session_id: str
    group_id: str
    node_id: str
    state: SessionState
    previous: SessionState | None = None
    seq: int = Field(ge=0)
    reason: str | None = None
    at: int = Field(default_factory=now_ms)

    @model_validator(mode="after")
    def _transition_allowed(self) -> SessionStateChanged:
        if self.previous is not None and self.state not in VALID_TRANSITIONS[self.previous]:
            raise ValueError(f"invalid transition {self.previous.value} -> {self.state.value}")
        return self


class SessionFinished(Event):
    """A session's end: its final diff and how it ended.

    Producer: gateway node. Consumers: scorer (grades ``diff``), rollout (joins calls and reward).
    ``status`` is terminal. ``agent_timed_out`` is true when the *agent's* budget ran out (a trainable negative);
    infrastructure failures have ``status=FAILED`` and a reason.
    """

    session_id: str
    group_id: str
    task_id: str
    task_source: str = "bundled"
    harness: str
    node_id: str
    status: SessionState
    reason: str | None = None
    diff: str = ""
    exit_code: int | None = None
    agent_timed_out: bool = False
    stdout_tail: str = ""
    stderr_tail: str = ""
    turns: int = Field(default=0, ge=0)
    calls: int = Field(
        default=0,
        ge=0,
        description="model calls recorded for the session (the ModelCallRecorded events to expect); calls the "
        "gateway could not serve have no record and are counted in timings_ms['failed_calls']",
    )
    timings_ms: dict[str, float] = Field(default_factory=dict)
    finished_at: int = Field(default_factory=now_ms)

    @model_validator(mode="after")
    def _terminal(self) -> SessionFinished:
        if self.status not in TERMINAL_STATES:
            raise ValueError(f"SessionFinished.status must be terminal, got {self.status.value}")
        return self


# ----------------------------------------------------------------------------------------------- model calls


FinishReason = Literal["stop", "length", "tool_calls", "stop_sequence", "abort", "error"]


class CallTimings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_ms: float = 0.0
    ttft_ms: float = 0.0  # to the first sampled token the gateway received; a non-streamed call receives all at once
    total_ms: float = 0.0


# Token ids and logprobs travel as compact strings (``contracts.arrays``) and are lists in memory; a plain JSON list
# (v1, fixtures) is read too. The serializer runs for JSON only, so ``model_dump()`` still gives lists.
TokenIds = Annotated[
    list[int], BeforeValidator(decode_ints), PlainSerializer(encode_ints, return_type=str, when_used="json")
]
Logprobs = Annotated[
    list[float], BeforeValidator(decode_floats), PlainSerializer(encode_floats, return_type=str, when_used="json")
]


class ModelCallRecorded(Event):
    """One model call at token level: what the model saw and what it sampled.

    Producer: gateway (after the client has received the answer: flush, then record). Consumer: rollout.
    Keyed by ``session_id``; ``call_index`` counts from 0 within a session and ``call_id`` is unique, so a
    redelivered record is recognised.

    Prompt delta encoding: the full prompt of this call is
    ``sequence(prefix_call_index)[:prefix_len] + prompt_token_ids`` where ``sequence(i)`` is call *i*'s full prompt
    followed by its completion ids. With ``prefix_call_index=None`` (and ``prefix_len=0``) ``prompt_token_ids`` is
    the whole prompt. ``prompt_len`` is the full length. Encoder and decoder: ``contracts.prompt_delta``.

    Request delta encoding (v2): ``request`` holds what changed against the full request of call
    ``request_base_call_index`` (messages after the first ``request_messages_prefix``, fields not in
    ``request_same``); with ``request_base_call_index=None`` it is the whole request. Encoder and decoder:
    ``contracts.request_delta``. Token ids and logprobs are compact strings on the wire (``contracts.arrays``).

    Retried calls: a call whose record the producer did not acknowledge (it failed, timed out, or the client left
    while it was sent) is not part of the session, and the harness usually asks again; the next call gets the same
    ``call_index``. The unacknowledged record may still land in Kafka (a broker that stalls, then stores what it had
    been sent), so the next recorded call lists those attempts in ``supersedes_call_ids`` and the consumer keeps it in
    their place (``rollout.calls.merge_call``); two records of one index that do not name each other are a conflict.

    Versions: 4 adds ``supersedes_call_ids``; 3 adds ``group_id`` (the topic's key: a group's calls reach the rollout
    shard that owns the group); 3, 2 (delta-encoded requests, compact arrays) and 1 (whole requests, JSON lists) are
    still read, as v4 records that supersede nothing, with no group id before v3 (the rollout attaches the group from
    the session's other events) and, for v1, no request base.

    Invariant: ``len(completion_logprobs) == len(completion_token_ids)``; each logprob is the sampling logprob of
    that token under the weights of ``weight_version``.
    """

    SCHEMA_VERSION: ClassVar[int] = 4
    READS: ClassVar[frozenset[int]] = frozenset({1, 2, 3, 4})
    schema_version: int = 4

    session_id: str
    group_id: str = Field(default="", description="the session's GRPO group (empty in records before v3)")
    call_index: int = Field(ge=0)
    call_id: str
    protocol: Protocol
    tokenization: TokenizationMode
    model: str
    engine_id: str = ""
    weight_version: int = Field(ge=0)
    prompt_token_ids: TokenIds
    prefix_call_index: int | None = None
    prefix_len: int = Field(default=0, ge=0)
    prompt_len: int = Field(ge=0)
    completion_token_ids: TokenIds
    completion_logprobs: Logprobs
    finish_reason: FinishReason
    prefix_extends_previous: bool | None = Field(
        default=None,
        description="does this prompt start with the previous call's prompt + sampled completion (the property the "
        "trainer needs)? Always true for exact-mode calls that extend a chain; canonical mode reports its breaks; "
        "null when there is no previous call or the mode does not check",
    )
    request: dict[str, Any] = Field(
        default_factory=dict, description="canonical request (or its delta against the base call), within a size cap"
    )
    request_base_call_index: int | None = Field(
        default=None, description="the earlier call whose full request this one's request is a delta against"
    )
    request_messages_prefix: int = Field(default=0, ge=0, description="leading messages taken from the base")
    request_same: list[str] = Field(default_factory=list, description="request fields equal to the base's")
    request_truncated: bool = False
    sampling: dict[str, Any] = Field(default_factory=dict, description="effective sampling parameters")
    gateway_changes: list[str] = Field(default_factory=list, description="what the gateway changed, e.g. overrides")
    timings: CallTimings = CallTimings()
    started_at: int = Field(default_factory=now_ms)
    supersedes_call_ids: list[str] = Field(
        default_factory=list,
        description="earlier attempts at this call_index whose record was not acknowledged: if one of them lands, "
        "this record replaces it (empty in records before v4)",
    )

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        # v1 -> v2 -> v3 -> v4: every older field means the same, a v1 request is whole (no base), a record before v3
        # names no group, and one before v4 supersedes nothing.
        if isinstance(data, dict) and data.get("schema_version") in (1, 2, 3):
            data = {**data, "schema_version": 4}
        return data

    @model_validator(mode="after")
    def _aligned(self) -> ModelCallRecorded:
        if len(self.completion_logprobs) != len(self.completion_token_ids):
            raise ValueError("completion_logprobs and completion_token_ids differ in length")
        if self.prefix_call_index is None and self.prefix_len:
            raise ValueError("prefix_len without prefix_call_index")
        if self.prefix_call_index is not None and self.prefix_call_index >= self.call_index:
            raise ValueError("prefix_call_index must name an earlier call")
        if self.prefix_len + len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError("prefix_len + len(prompt_token_ids) != prompt_len")
        if self.request_base_call_index is None:
            if self.request_messages_prefix or self.request_same:
                raise ValueError("request_messages_prefix or request_same without request_base_call_index")
        elif self.request_base_call_index >= self.call_index:
            raise ValueError("request_base_call_index must name an earlier call")
        if self.call_id in self.supersedes_call_ids:
            raise ValueError("a call cannot supersede itself")
        return self


# -------------------------------------------------------------------------------------------------- rewards


class Outcome(enum.StrEnum):
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    ERROR = "error"  # the fault is ours (infrastructure): the session is masked, not a negative


class RewardPublished(Event):
    """The grade of one session's diff.

    Producer: scorer. Consumer: rollout. Exactly one per session (the scorer dedupes redelivered
    ``SessionFinished``); ``reward`` is finite and in [0, 1] for the SWE evaluator.
    """

    session_id: str
    group_id: str
    task_id: str
    evaluator: str = "swebench"
    reward: float
    outcome: Outcome
    resolved: bool
    tests: dict[str, str] = Field(
        default_factory=dict,
        description="test name -> PASSED/FAILED/ERROR/SKIPPED, or MISSING: a listed test the log has no result for "
        "(never collected)",
    )
    apply_status: str = ""
    reason: str | None = None
    timings_ms: dict[str, float] = Field(default_factory=dict)
    scored_at: int = Field(default_factory=now_ms)

    @model_validator(mode="after")
    def _finite(self) -> RewardPublished:
        if self.reward != self.reward or self.reward in (float("inf"), float("-inf")):
            raise ValueError("reward must be finite")
        return self


# -------------------------------------------------------------------------------------------------- training


class TrajectoryBatch(Event):
    """A batch of training sequences, Arrow-encoded with ``contracts.arrow.TRAJECTORY_SCHEMA``.

    Producer: rollout. Consumer: learner. The Arrow IPC stream travels inline (``arrow_ipc``, framed after the
    JSON header by ``contracts.codec``) or, above the topic's inline limit, as a claim check: ``uri`` + ``sha256``
    of an immutable file written before the event. Exactly one of the two is set.
    """

    batch_id: str
    step: int = Field(ge=0, description="rollout step this batch is for")
    num_rows: int = Field(ge=0)
    num_groups: int = Field(ge=0)
    num_sessions: int = Field(ge=0)
    builder: str
    min_weight_version: int = Field(ge=0)
    max_weight_version: int = Field(ge=0)
    uri: str | None = None
    sha256: str | None = None
    size_bytes: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    created_at: int = Field(default_factory=now_ms)
    # Inline Arrow IPC stream: bytes when built, a zero-copy memoryview of the Kafka message when decoded.
    arrow_ipc: bytes | memoryview | None = Field(default=None, exclude=True, repr=False)

    @model_validator(mode="after")
    def _one_payload(self) -> TrajectoryBatch:
        if (self.arrow_ipc is None) == (self.uri is None):
            raise ValueError("exactly one of arrow_ipc (inline) and uri (claim check) must be set")
        if self.uri is not None and not self.sha256:
            raise ValueError("a claim-check uri needs its sha256")
        return self


class AssembledSession(BaseModel):
    """One session of an assembled group: how many of the group's rows are its own (rows are in session order)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    harness: str
    rows: int = Field(ge=0)
    trainable: bool
    resolved: bool = False
    stats: dict[str, int] = Field(default_factory=dict, description="reconstruction counts (calls, chains, ...)")


class GroupAssembled(Event):
    """A whole GRPO group turned into trajectory rows (advantages included) by the rollout shard that owns it.

    Producer: rollout shards (each owns the group-keyed partitions the consumer group gave it). Consumer: the
    rollout leader (one at a time: the topic has one partition), which selects groups, numbers steps and publishes
    ``TrajectoryBatch``. Published exactly once per group, in the transaction that consumes the group's last input.
    Rows use ``contracts.arrow.TRAJECTORY_SCHEMA``; the Arrow IPC stream is inline (``arrow_ipc``, framed like a
    batch's) or a claim check (``uri`` + ``sha256``).
    """

    group_id: str
    kind: SessionKind = SessionKind.TRAIN
    builder: str
    rollout_step: int = Field(default=0, ge=0)
    metadata: dict[str, str] = Field(default_factory=dict, description="the scheduler's bookkeeping from the request")
    zero_signal: bool
    trainable_sessions: int = Field(ge=0)
    finished_at: int
    sessions: list[AssembledSession]
    uri: str | None = None
    sha256: str | None = None
    size_bytes: int = Field(ge=0)
    arrow_ipc: bytes | memoryview | None = Field(default=None, exclude=True, repr=False)

    @model_validator(mode="after")
    def _one_payload(self) -> GroupAssembled:
        if (self.arrow_ipc is None) == (self.uri is None):
            raise ValueError("exactly one of arrow_ipc (inline) and uri (claim check) must be set")
        if self.uri is not None and not self.sha256:
            raise ValueError("a claim-check uri needs its sha256")
        return self


class WeightsPublished(Event):
    """A new policy version is on disk.

    Producer: learner. Consumers: inference engines (hot-reload), gateway and rollout (staleness).
    ``uri`` is a checkpoint directory with safetensors weights + config + tokenizer. Versions only increase.
    """

    version: int = Field(ge=0)
    uri: str
    step: int = Field(ge=0)
    base_model: str = Field(default="policy", description="policy name; the compacted topic keeps the latest per name")
    batch_id: str | None = Field(default=None, description="the TrajectoryBatch this version was trained on")
    metrics: dict[str, float] = Field(default_factory=dict)
    published_at: int = Field(default_factory=now_ms)


class DeadLetter(Event):
    """A message a consumer could not decode or handle, with the reason. Producer: any consumer (eventbus).
    Consumer: operators (``floe replay --topic floe.dead-letter``)."""

    source_topic: str
    partition: int
    offset: int
    key: str | None = None
    value_b64: str
    error_type: str
    reason: str
    consumer_group: str | None = None
    at: int = Field(default_factory=now_ms)
