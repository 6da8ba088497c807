"""Trajectory batches -> tensors: decode, fetch claim checks, filter, weight and group into micro-batches.

Role: turn one ``contracts.TrajectoryBatch`` (Arrow rows of ``contracts.arrow.TRAJECTORY_SCHEMA``) into
``MicroBatch`` objects the training step can feed to a causal LM.

- The Arrow list columns are read as flat value buffers + offsets and wrapped as tensors without copying
  (``torch.from_numpy`` over Arrow's buffers). Only the micro-batches are materialised.
- A claim-check batch (``uri`` + ``sha256``) is read from a ``file://`` URI or a plain path and its sha256 is
  checked before decoding. Other schemes are refused with ``BatchError`` (object stores are future work).
- Every target token keeps its sampling logprob and the weight version that sampled it; prompt and masked
  positions never become trainable here.
- Aggregation weights are computed over the whole (global) batch *before* grouping, so how sequences are split
  into micro-batches and ranks does not change the loss.
- Two layouts (``Layout``, the learner's ``micro_batch_layout``). ``packed`` (default): the sequences of a
  micro-batch are concatenated into one ``(1, N)`` row with ``position_ids`` restarting at 0 per sequence and their
  boundaries (``cu_seq_lens``); ``learner.model`` keeps each sequence's attention to itself, so a micro-batch costs
  its real tokens only. ``padded``: one right-padded row per sequence, ``(B, T)`` with an attention mask; every
  attention backend takes it, and it costs the padding (``B * T - N`` slots), which sorting by length keeps small.
  Both give the same loss and gradients to fp32 rounding (``tests/test_packing.py``).

Limits: an overlong row keeps its longest causal prefix (prompt + the start of the response), as Polar does; a row
whose prompt alone is over ``max_seq_len`` is dropped. A sequence longer than ``micro_batch_tokens`` gets a
micro-batch alone, in either layout.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

import pyarrow as pa
import torch
from torch import Tensor

from contracts import TrajectoryBatch, read_ipc
from learner.grpo import Aggregation, staleness_filter, token_weights

__all__ = [
    "LAYOUTS",
    "BatchError",
    "Layout",
    "MicroBatch",
    "PreparedBatch",
    "Sequences",
    "batch_payload",
    "decode_sequences",
    "microbatches",
    "pack",
    "prepare",
]


Layout = Literal["packed", "padded"]
LAYOUTS: tuple[Layout, ...] = ("packed", "padded")


class BatchError(ValueError):
    """A trajectory batch that cannot be trained on (bad claim check, bad checksum, bad rows)."""


def batch_payload(event: TrajectoryBatch) -> bytes | memoryview:
    """The Arrow IPC bytes of a batch: inline, or read from its claim-check URI with the sha256 verified."""
    if event.arrow_ipc is not None:
        return event.arrow_ipc
    assert event.uri is not None and event.sha256 is not None  # guaranteed by the contract's validator
    path = _uri_path(event.uri)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BatchError(f"batch {event.batch_id}: cannot read claim check {event.uri}: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != event.sha256.lower():
        raise BatchError(f"batch {event.batch_id}: sha256 mismatch for {event.uri}: got {digest}, want {event.sha256}")
    return data


def _uri_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    raise BatchError(f"unsupported claim-check scheme {parsed.scheme!r} in {uri!r} (supported: file://, plain paths)")


def _tensor(arr: pa.Array) -> Tensor:
    """Arrow primitive array -> tensor over the same memory (no copy)."""
    np_arr = arr.to_numpy(zero_copy_only=True)
    with warnings.catch_warnings():
        # Arrow buffers are read-only; torch warns that writing would be undefined. We never write into them.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np_arr)


@dataclass(frozen=True)
class Sequences:
    """The rows of one batch as flat per-token tensors (views over Arrow memory) plus per-row tensors."""

    batch_id: str
    tokens: Tensor  # (N,) int32, all rows concatenated
    offsets: Tensor  # (R+1,) int64, row r is tokens[offsets[r]:offsets[r+1]]
    loss_mask: Tensor  # (N,) uint8
    logprobs: Tensor  # (N,) float32 sampling logprobs
    weight_versions: Tensor  # (N,) int32, -1 where masked
    prompt_len: Tensor  # (R,) int32
    reward: Tensor  # (R,) float32
    advantage: Tensor  # (R,) float32
    session_weight: Tensor  # (R,) float32
    session_index: Tensor  # (R,) int64, dense index of session_id
    group_index: Tensor  # (R,) int64, dense index of group_id

    @property
    def num_rows(self) -> int:
        return int(self.offsets.numel()) - 1

    @property
    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]


def decode_sequences(data: bytes | memoryview | pa.Table, batch_id: str = "") -> Sequences:
    """Decode Arrow IPC bytes (or an already-read table) into ``Sequences``; raises ``contracts.DecodeError``."""
    table = data if isinstance(data, pa.Table) else read_ipc(data)
    table = table.combine_chunks()  # no-op for the usual single-chunk stream; makes each column one array

    def lists(name: str) -> tuple[Tensor, Tensor]:
        col = table.column(name)
        arr = col.chunk(0) if col.num_chunks else pa.array([], type=col.type)
        offsets = _tensor(arr.offsets).to(torch.int64)
        values = _tensor(arr.values)  # full child buffer; offsets index into it
        return values, offsets

    tokens, offsets = lists("tokens")
    loss_mask, mask_offsets = lists("loss_mask")
    logprobs, lp_offsets = lists("logprobs")
    versions, v_offsets = lists("weight_versions")
    for name, other in (("loss_mask", mask_offsets), ("logprobs", lp_offsets), ("weight_versions", v_offsets)):
        # validate_table checked lengths; offsets can still differ in base (sliced child arrays), so rebase.
        if not torch.equal(other - other[0], offsets - offsets[0]):
            raise BatchError(f"batch {batch_id}: column {name!r} offsets differ from 'tokens'")
    start, stop = int(offsets[0]), int(offsets[-1]) if offsets.numel() else 0

    def per_row(name: str) -> Tensor:
        col = table.column(name)
        return _tensor(col.chunk(0)) if col.num_chunks else torch.empty(0)

    def dense(name: str) -> Tensor:
        values = table.column(name).to_pylist()
        index: dict[str, int] = {}
        return torch.tensor([index.setdefault(v, len(index)) for v in values], dtype=torch.int64)

    return Sequences(
        batch_id=batch_id,
        tokens=tokens[start:stop],
        offsets=offsets - offsets[0],
        loss_mask=loss_mask[int(mask_offsets[0]) : int(mask_offsets[-1])],
        logprobs=logprobs[int(lp_offsets[0]) : int(lp_offsets[-1])],
        weight_versions=versions[int(v_offsets[0]) : int(v_offsets[-1])],
        prompt_len=per_row("prompt_len"),
        reward=per_row("reward"),
        advantage=per_row("advantage"),
        session_weight=per_row("session_weight"),
        session_index=dense("session_id"),
        group_index=dense("group_id"),
    )


@dataclass(frozen=True)
class PreparedBatch:
    """A batch after truncation, the staleness filter and weighting: what gets packed and trained on."""

    seqs: Sequences
    rows: list[int]  # rows kept (each has at least one trainable token)
    lengths: list[int]  # length of each kept row after truncation
    trainable: Tensor  # (N,) bool over Sequences.tokens after filter and truncation
    weights: Tensor  # (N,) float32 aggregation weights, summing to 1 over the global batch
    stats: dict[str, float] = field(default_factory=dict)


def prepare(
    seqs: Sequences,
    current_version: int,
    max_staleness: int | None,
    agg: Aggregation,
    max_seq_len: int,
    skip_zero_advantage: bool = False,
) -> PreparedBatch:
    """Apply truncation and the staleness filter, compute global aggregation weights, keep trainable rows.

    ``skip_zero_advantage``: also leave out rows whose advantage is 0 (a group whose rewards were all equal). Only
    exact when nothing but the advantage-weighted term has a gradient (no KL to a reference, one optimizer step per
    batch): such a row's loss is ``-0 * ratio`` for every token. The aggregation weights are computed before, over
    every trainable token, so the rows that remain get the weights (and the update) they had with the others."""
    n = int(seqs.tokens.numel())
    row_of_token = torch.repeat_interleave(torch.arange(seqs.num_rows), seqs.lengths)  # (N,)
    pos_in_row = torch.arange(n) - seqs.offsets[:-1][row_of_token]  # (N,)
    # Position 0 has no context, so it can never be a target; the prompt is never trainable, whatever the mask says.
    in_response = (pos_in_row >= seqs.prompt_len[row_of_token].to(torch.int64)) & (pos_in_row > 0)
    in_budget = pos_in_row < max_seq_len
    flagged = seqs.loss_mask.bool()
    st = staleness_filter(seqs.loss_mask, seqs.weight_versions, current_version, max_staleness)
    keep = st.keep & in_response & in_budget
    weights = token_weights(keep, row_of_token, seqs.session_index, seqs.session_weight, agg)
    tokens_per_row = torch.zeros(seqs.num_rows, dtype=torch.int64).index_add_(0, row_of_token, keep.to(torch.int64))
    prompt_over = seqs.prompt_len.to(torch.int64) >= max_seq_len
    live = [r for r in range(seqs.num_rows) if tokens_per_row[r] > 0]
    rows = [r for r in live if float(seqs.advantage[r]) != 0.0] if skip_zero_advantage else live
    lengths = [min(int(seqs.lengths[r]), max_seq_len) for r in rows]
    stats = {
        "rows": float(seqs.num_rows),
        "rows_trained": float(len(rows)),
        "rows_skipped_zero_advantage": float(len(live) - len(rows)),
        "tokens_total": float(n),
        "tokens_flagged": float(flagged.sum()),
        "tokens_trainable": float(keep.sum()),
        "tokens_dropped_stale": float(st.dropped_stale),
        "tokens_dropped_invalid_version": float(st.dropped_invalid),
        "tokens_dropped_overlong": float((st.keep & in_response & ~in_budget).sum()),
        "tokens_dropped_in_prompt": float((flagged & ~in_response).sum()),
        "rows_dropped_prompt_overlong": float(prompt_over.sum()),
        "staleness_max": float(st.max_lag),
        "staleness_mean": st.mean_lag,
        "reward_mean": float(seqs.reward.double().mean()) if seqs.num_rows else 0.0,
        "advantage_abs_mean": float(seqs.advantage.double().abs().mean()) if seqs.num_rows else 0.0,
    }
    return PreparedBatch(seqs=seqs, rows=rows, lengths=lengths, trainable=keep, weights=weights, stats=stats)


def pack(lengths: list[int], token_budget: int, layout: Layout = "padded") -> list[list[int]]:
    """Group items (by index into ``lengths``) into micro-batches of at most ``token_budget`` token slots; an item
    over budget gets a micro-batch alone.

    ``padded``: a micro-batch's slots are ``len(mb) * max_len``; longest first, so the rows of a micro-batch have
    similar lengths and padding stays small. ``packed``: its slots are ``sum(lengths)``; first-fit decreasing, which
    fills micro-batches to the budget (fewer forward calls) whatever the mix of lengths."""
    assert token_budget > 0, "token_budget must be positive"
    assert layout in LAYOUTS, f"unknown layout {layout!r}; choose one of {LAYOUTS}"
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    if layout == "packed":
        room: list[int] = []  # free slots per micro-batch
        for i in order:
            j = next((j for j, free in enumerate(room) if free >= lengths[i]), len(out))
            if j == len(out):
                out.append([])
                room.append(token_budget)
            out[j].append(i)
            room[j] -= lengths[i]
        return out
    current: list[int] = []
    for i in order:
        # Sorted descending, so the first item of a micro-batch is its longest.
        if current and (len(current) + 1) * lengths[current[0]] > token_budget:
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    return out


@dataclass(frozen=True)
class MicroBatch:
    """Model inputs and per-target tensors. Targets are ``input_ids[:, 1:]``; all (B, T-1) tensors are aligned with
    the logits of positions ``0..T-2``.

    Padded: one sequence per row, right-padded, ``attention_mask`` set, ``position_ids`` and ``cu_seq_lens`` None.
    Packed: ``B = 1``, the sequences back to back; ``attention_mask`` None, ``position_ids`` restart at 0 per
    sequence, ``cu_seq_lens`` are their boundaries. The position of a sequence's last token would predict the next
    sequence's first token: it is masked (as is every position of padding)."""

    input_ids: Tensor  # (B, T) int64; padded rows hold 0 after their sequence
    attention_mask: Tensor | None  # (B, T) int64 for padded rows; None when packed
    mask: Tensor  # (B, T-1) bool, trainable targets
    behav_logprobs: Tensor  # (B, T-1) float32
    advantages: Tensor  # (B, T-1) float32, the row's advantage broadcast
    weights: Tensor  # (B, T-1) float32, aggregation weights (zero where masked)
    versions: Tensor  # (B, T-1) int64 sampling weight versions
    num_tokens: int  # real (unpadded) tokens
    position_ids: Tensor | None = None  # (1, T) int64 when packed: 0..L-1 for each sequence
    cu_seq_lens: Tensor | None = None  # (S+1,) int32 when packed: sequence s is input_ids[0, cu[s]:cu[s+1]]
    max_length: int = 0  # when packed: the longest sequence (flash-attention's max_length_q/k)

    @property
    def packed(self) -> bool:
        return self.cu_seq_lens is not None

    @property
    def token_slots(self) -> int:
        """Positions the model computes: ``num_tokens`` plus padding."""
        return int(self.input_ids.numel())

    def to(self, device: torch.device) -> MicroBatch:
        def move(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.to(device, non_blocking=True)

        return MicroBatch(
            input_ids=self.input_ids.to(device, non_blocking=True),
            attention_mask=move(self.attention_mask),
            mask=self.mask.to(device, non_blocking=True),
            behav_logprobs=self.behav_logprobs.to(device, non_blocking=True),
            advantages=self.advantages.to(device, non_blocking=True),
            weights=self.weights.to(device, non_blocking=True),
            versions=self.versions.to(device, non_blocking=True),
            num_tokens=self.num_tokens,
            position_ids=move(self.position_ids),
            cu_seq_lens=move(self.cu_seq_lens),
            max_length=self.max_length,
        )


def _build(batch: PreparedBatch, items: list[int]) -> MicroBatch:
    seqs = batch.seqs
    rows = [batch.rows[i] for i in items]
    lens = [batch.lengths[i] for i in items]
    b, t = len(rows), max(max(lens), 2)
    input_ids = torch.zeros(b, t, dtype=torch.int64)
    attention = torch.zeros(b, t, dtype=torch.int64)
    mask = torch.zeros(b, t, dtype=torch.bool)
    behav = torch.zeros(b, t, dtype=torch.float32)
    weights = torch.zeros(b, t, dtype=torch.float32)
    versions = torch.full((b, t), -1, dtype=torch.int64)
    adv = torch.zeros(b, t - 1, dtype=torch.float32)
    for j, (r, n) in enumerate(zip(rows, lens, strict=True)):
        lo = int(seqs.offsets[r])
        sl = slice(lo, lo + n)
        input_ids[j, :n] = seqs.tokens[sl]
        attention[j, :n] = 1
        mask[j, :n] = batch.trainable[sl]
        behav[j, :n] = seqs.logprobs[sl]
        weights[j, :n] = batch.weights[sl]
        versions[j, :n] = seqs.weight_versions[sl]
        adv[j, :] = seqs.advantage[r]
    # Per-token columns describe token i; its logprob comes from the logits at position i-1.
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        mask=mask[:, 1:],
        behav_logprobs=behav[:, 1:],
        advantages=adv,
        weights=weights[:, 1:],
        versions=versions[:, 1:],
        num_tokens=sum(lens),
    )


def _build_packed(batch: PreparedBatch, items: list[int]) -> MicroBatch:
    seqs = batch.seqs
    rows = torch.tensor([batch.rows[i] for i in items], dtype=torch.int64)
    lens = torch.tensor([batch.lengths[i] for i in items], dtype=torch.int64)
    n = int(lens.sum())
    cu = torch.zeros(len(items) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=cu[1:])
    seq_of = torch.repeat_interleave(torch.arange(len(items)), lens)  # (N,) sequence of each packed position
    pos = torch.arange(n) - cu[:-1][seq_of]  # (N,) position inside its sequence
    src = seqs.offsets[rows][seq_of] + pos  # (N,) index into the flat Sequences columns
    # Per-token columns describe token i; its logprob comes from the logits at position i-1. Shifting the whole
    # row by one puts the next sequence's first token behind each sequence's last position: never a target
    # (``prepare`` never trains position 0), and masked below in every column to be explicit.
    boundary = cu[1:-1] - 1  # last position of every sequence but the final one
    mask = batch.trainable[src][1:]  # indexing copies: the Arrow buffers are never written
    mask[boundary] = False
    behav = seqs.logprobs[src][1:]
    behav[boundary] = 0.0
    weights = batch.weights[src][1:]
    weights[boundary] = 0.0
    versions = seqs.weight_versions[src][1:].to(torch.int64)
    versions[boundary] = -1
    return MicroBatch(
        input_ids=seqs.tokens[src].to(torch.int64)[None],
        attention_mask=None,
        mask=mask[None],
        behav_logprobs=behav[None],
        advantages=seqs.advantage[rows][seq_of][:-1][None],
        weights=weights[None],
        versions=versions[None],
        num_tokens=n,
        position_ids=pos[None],
        cu_seq_lens=cu.to(torch.int32),
        max_length=int(lens.max()),
    )


def microbatches(
    batch: PreparedBatch, token_budget: int, rank: int = 0, world_size: int = 1, layout: Layout = "packed"
) -> list[MicroBatch]:
    """This rank's micro-batches in ``layout``. Micro-batches are dealt round-robin (largest first) so ranks get
    similar work; every rank gets the same *count* (DDP/FSDP need matching collectives), padded with empty
    micro-batches."""
    groups = pack(batch.lengths, token_budget, layout)
    per_rank = -(-len(groups) // world_size) if groups else 1
    build = _build_packed if layout == "packed" else _build
    mine = [build(batch, g) for g in groups[rank::world_size]]
    while len(mine) < per_rank:
        mine.append(_empty())
    return mine


def _empty() -> MicroBatch:
    """A zero-weight micro-batch: runs forward/backward (so collectives match) and contributes nothing. Padded in
    either layout: one 2-token row is the same work both ways, and it uses every parameter as any other does."""
    return MicroBatch(
        input_ids=torch.zeros(1, 2, dtype=torch.int64),
        attention_mask=torch.ones(1, 2, dtype=torch.int64),
        mask=torch.zeros(1, 1, dtype=torch.bool),
        behav_logprobs=torch.zeros(1, 1),
        advantages=torch.zeros(1, 1),
        weights=torch.zeros(1, 1),
        versions=torch.full((1, 1), -1, dtype=torch.int64),
        num_tokens=0,
    )
