"""The CPU generation engine: continuous batching with a shared KV cache, per-token logprobs, hot weight swaps.

Role: one background thread owns the model. Each engine step it (1) admits queued requests into the running batch,
up to ``max_batch`` rows: their prompts are prefilled together (left-padded, in chunks of ``prefill_chunk`` tokens)
and their KV cache is merged into the batch's ``DynamicCache`` (left-padded to a common length); (2) samples one
token for every running row and streams it (id, raw logprob, top-k alternatives) to the request's asyncio queue at
once; (3) retires finished rows (trimming all-padding cache columns) and (4) runs one batched decode forward.
So a new request waits at most one decode step plus its own prefill, not for the whole batch to finish.

Weight swaps happen only on an empty batch: once new weights are scheduled, admission pauses, the running rows finish
on the old weights, the model is swapped, and admission resumes. Every request is therefore produced by exactly one
weight version, which is the one it reports. Versions never go backwards (older or equal versions are ignored).

Limits: CPU, float32, single process; no prefix caching across requests; no paged attention (padding in the merged
cache costs memory proportional to the longest running prompt).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog
import torch
from transformers import DynamicCache, PreTrainedModel

from inference.checkpoint import Checkpoint, load_checkpoint
from inference.sampling import SamplingParams, sample_batch
from inference.tokenizer import Tokenizer

__all__ = [
    "ContextLengthError",
    "Engine",
    "EngineClosedError",
    "Finish",
    "GenerationHandle",
    "TokenEvent",
]

log = structlog.get_logger()

FinishReason = Literal["stop", "length", "abort"]


class ContextLengthError(ValueError):
    """The prompt (plus requested completion) does not fit the model's context."""


class EngineClosedError(RuntimeError):
    """The engine was shut down before the request finished."""


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...]
    version: int


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    # The stop string or stop token id that ended generation; None for EOS, length and abort (vLLM semantics).
    stop_reason: int | str | None
    version: int


_Item = TokenEvent | Finish | BaseException


@dataclass(eq=False)
class GenerationHandle:
    """One submitted request. Iterate it (async) for ``TokenEvent``s, ending with one ``Finish``."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    _loop: asyncio.AbstractEventLoop
    _queue: asyncio.Queue[_Item] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    version: int | None = None
    submitted_at: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        # Read by the engine thread at its next step; a plain bool write is atomic enough for a flag.
        self.cancelled = True

    def _put(self, item: _Item) -> None:
        with contextlib.suppress(RuntimeError):  # loop already closed: nobody is listening any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def __aiter__(self) -> AsyncIterator[TokenEvent | Finish]:
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, Finish):
                return


@dataclass
class _Row:
    handle: GenerationHandle
    generator: torch.Generator | None
    out_ids: list[int] = field(default_factory=list)
    done: bool = False


def _layers(cache: DynamicCache) -> list[Any]:
    """The cache's per-layer ``DynamicLayer``s (``keys``/``values``: (B, H_kv, T, D)); typed loosely upstream."""
    return list(cache.layers)


class _Batch:
    """The running batch: rows, their shared KV cache (left-padded), attention mask, positions, next-token logits."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (B, T) 1 = real token
        self.last_pos: torch.Tensor | None = None  # (B,) position id of each row's last token
        self.logits: torch.Tensor | None = None  # (B, V) float32, for the token each row samples next

    def merge(
        self, rows: list[_Row], cache: DynamicCache, mask: torch.Tensor, last_pos: torch.Tensor, logits: torch.Tensor
    ) -> None:
        if not self.rows or self.cache is None or self.mask is None or self.last_pos is None or self.logits is None:
            self.rows, self.cache, self.mask, self.last_pos, self.logits = list(rows), cache, mask, last_pos, logits
            return
        width = max(self.mask.shape[1], mask.shape[1])

        def left_pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            missing = width - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([torch.zeros(shape, dtype=t.dtype), t], dim=dim)

        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            # (B, H, T, D): padded key/value slots are never attended (mask 0), zeros are as good as anything.
            mine.keys = torch.cat([left_pad(mine.keys, 2), left_pad(theirs.keys, 2)], dim=0)
            mine.values = torch.cat([left_pad(mine.values, 2), left_pad(theirs.values, 2)], dim=0)
        self.mask = torch.cat([left_pad(self.mask, 1), left_pad(mask, 1)], dim=0)
        self.last_pos = torch.cat([self.last_pos, last_pos])
        self.logits = torch.cat([self.logits, logits], dim=0)
        self.rows.extend(rows)

    def select(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.last_pos = self.logits = None
            return
        assert self.cache is not None and self.mask is not None and self.last_pos is not None
        index = torch.tensor(keep, dtype=torch.long)
        mask = self.mask[index]
        # Drop leading columns that are padding for every remaining row, so the cache does not grow without bound.
        first = int(mask.any(dim=0).nonzero()[0].item())
        for layer in _layers(self.cache):
            layer.keys = layer.keys[index, :, first:, :]
            layer.values = layer.values[index, :, first:, :]
        self.mask = mask[:, first:]
        self.last_pos = self.last_pos[index]
        if self.logits is not None:
            self.logits = self.logits[index]


class Engine:
    """Owns the model and the generation thread. Thread-safe ``submit``; async consumption of results."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        max_batch: int = 16,
        batch_wait_s: float = 0.005,
        prefill_chunk: int = 1024,
        max_model_len: int | None = None,
        threads: int | None = None,
        seed: int | None = None,
    ) -> None:
        self._model: PreTrainedModel = checkpoint.model
        self.tokenizer: Tokenizer = checkpoint.tokenizer
        self._version = checkpoint.version
        self._checkpoint_path = checkpoint.path
        config_len = int(getattr(self._model.config, "max_position_embeddings", 2048))
        self.max_model_len = min(max_model_len or config_len, config_len)
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.prefill_chunk = prefill_chunk
        self.threads = threads
        eos = self._model.config.eos_token_id
        eos_list = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.eos_token_ids: frozenset[int] = frozenset(int(e) for e in eos_list)
        pad = self._model.config.pad_token_id
        self._pad_id = int(pad) if pad is not None else 0
        self._pending: deque[GenerationHandle] = deque()
        self._cond = threading.Condition()
        self._swap: Checkpoint | None = None
        self._stopping = False
        self._ids = itertools.count()
        self._rng = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % (2**62)))
        self._thread: threading.Thread | None = None
        self.stats = {"prefills": 0, "joins": 0, "tokens": 0, "swaps": 0}

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inference-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def version(self) -> int:
        """The version of the weights in use (a scheduled swap counts once applied)."""
        return self._version

    @property
    def checkpoint_path(self) -> str:
        return str(self._checkpoint_path)

    # --- requests ----------------------------------------------------------------------------------------------

    def check_length(self, prompt_len: int, max_tokens: int | None) -> int:
        """Validate lengths and return the effective ``max_tokens``; raises ``ContextLengthError``."""
        if prompt_len >= self.max_model_len:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input messages."
            )
        room = self.max_model_len - prompt_len
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the input, {max_tokens} in the completion). "
                "Please reduce the length of the input or the completion."
            )
        return max_tokens

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> GenerationHandle:
        """Queue a request; must be called from the event loop that will consume the handle."""
        vocab = int(self._model.config.vocab_size)
        if not prompt_ids:
            raise ValueError("the prompt must contain at least one token")
        if any(t < 0 or t >= vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        self.check_length(len(prompt_ids), params.max_tokens)
        handle = GenerationHandle(
            request_id=request_id or f"req-{next(self._ids)}",
            prompt_ids=list(prompt_ids),
            params=params,
            _loop=asyncio.get_running_loop(),
        )
        with self._cond:
            if self._stopping:
                raise EngineClosedError("engine is shutting down")
            self._pending.append(handle)
            self._cond.notify_all()
        return handle

    def request_swap(self, checkpoint: Checkpoint) -> bool:
        """Schedule new weights for the next empty-batch boundary. Returns False (and ignores it) if not newer."""
        with self._cond:
            newest = max(self._version, self._swap.version if self._swap is not None else -1)
            if checkpoint.version <= newest:
                return False
            if int(checkpoint.model.config.vocab_size) != int(self._model.config.vocab_size):
                raise ValueError("new checkpoint has a different vocabulary size; refusing to swap")
            self._swap = checkpoint
            self._cond.notify_all()
            return True

    async def load_weights(self, path: Path, version: int) -> bool:
        """``reloader.WeightsTarget``: load ``path`` in a worker thread (serving goes on), then ``request_swap``."""
        checkpoint = await asyncio.to_thread(load_checkpoint, path, version=version)
        return self.request_swap(checkpoint)

    def queue_depth(self) -> int:
        return len(self._pending)

    # --- engine thread -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        batch = _Batch()
        while True:
            with self._cond:
                while not self._pending and not batch.rows and self._swap is None and not self._stopping:
                    self._cond.wait(timeout=0.5)
                if self._stopping:
                    break
                # Swap only on an empty batch: every request runs start to finish on one weight version.
                # While a swap waits, admission pauses so the running rows drain.
                if not batch.rows:
                    self._apply_swap_locked()
                admit: list[GenerationHandle] = []
                if self._swap is None and self._pending and len(batch.rows) < self.max_batch:
                    if not batch.rows and self.batch_wait_s > 0:
                        # An idle engine waits a moment so simultaneous arrivals share one prefill.
                        deadline = time.monotonic() + self.batch_wait_s
                        while len(self._pending) < self.max_batch and not self._stopping:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            self._cond.wait(timeout=left)
                    while self._pending and len(batch.rows) + len(admit) < self.max_batch:
                        handle = self._pending.popleft()
                        if not handle.cancelled:
                            admit.append(handle)
            try:
                if admit:
                    self._admit(batch, admit)
                if batch.rows:
                    self._step(batch)
            except Exception as exc:  # a bug or OOM must fail these requests, not kill the engine thread
                log.exception("engine_step_failed", error=str(exc), batch=len(batch.rows))
                for row in batch.rows:
                    row.handle._put(exc)
                batch = _Batch()
        with self._cond:
            leftover = list(self._pending)
            self._pending.clear()
        for h in leftover + [r.handle for r in batch.rows]:
            h._put(EngineClosedError("engine stopped"))

    def _apply_swap_locked(self) -> None:
        if self._swap is None:
            return
        old = self._version
        self._model = self._swap.model
        self._version = self._swap.version
        self._checkpoint_path = self._swap.path
        self._swap = None
        self.stats["swaps"] += 1
        log.info("weights_swapped", old_version=old, new_version=self._version, path=str(self._checkpoint_path))

    @torch.inference_mode()
    def _admit(self, batch: _Batch, handles: list[GenerationHandle]) -> None:
        """Prefill ``handles`` together (left-padded, chunked) and merge them into the running batch."""
        model, version = self._model, self._version
        self.stats["prefills"] += 1
        n = len(handles)
        width = max(len(h.prompt_ids) for h in handles)
        input_ids = torch.full((n, width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, h in enumerate(handles):  # left padding keeps every row's last prompt token in the last column
            k = len(h.prompt_ids)
            input_ids[i, width - k :] = torch.tensor(h.prompt_ids, dtype=torch.long)
            mask[i, width - k :] = 1
            h.version = version
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (n, T)
        cache = DynamicCache(config=model.config)
        logits: torch.Tensor | None = None
        # Chunked prefill bounds attention memory for long prompts: O(chunk * T), not O(T^2).
        for start in range(0, width, self.prefill_chunk):
            end = min(width, start + self.prefill_chunk)
            sub_mask = mask[:, :end]
            out = model(
                input_ids=input_ids[:, start:end],
                attention_mask=sub_mask if bool((sub_mask == 0).any()) else None,
                position_ids=positions[:, start:end],
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1, :]
        assert logits is not None
        rows = [
            _Row(h, torch.Generator().manual_seed(h.params.seed) if h.params.seed is not None else self._rng)
            for h in handles
        ]
        if batch.rows:
            self.stats["joins"] += 1  # admitted into a batch that was already decoding
        batch.merge(rows, cache, mask, positions[:, -1], logits.float())

    @torch.inference_mode()
    def _step(self, batch: _Batch) -> None:
        """Sample one token for every running row, retire finished rows, run one decode forward for the rest."""
        version = self._version
        assert batch.logits is not None and batch.mask is not None and batch.last_pos is not None
        rows = batch.rows
        raw = torch.log_softmax(batch.logits, dim=-1)  # (B, V)
        uniforms = torch.cat([torch.rand(1, generator=row.generator) for row in rows])  # (B,)
        tokens = sample_batch(batch.logits, raw, [row.handle.params for row in rows], uniforms)  # (B,)
        token_lps = raw.gather(1, tokens[:, None]).squeeze(1)  # (B,)
        if bool(torch.isnan(token_lps).any()):
            raise FloatingPointError("NaN logprob: the model produced invalid logits")
        want = max((row.handle.params.logprobs or 0) for row in rows)
        top_vals: list[list[float]] = []
        top_ids: list[list[int]] = []
        if want:
            values, idx = torch.topk(raw, min(want, raw.shape[-1]), dim=-1)
            top_vals, top_ids = values.tolist(), idx.tolist()
        outbox: list[tuple[GenerationHandle, _Item]] = []
        for i, (row, token, lp) in enumerate(zip(rows, tokens.tolist(), token_lps.tolist(), strict=True)):
            if row.handle.cancelled:
                row.done = True
                outbox.append((row.handle, Finish("abort", None, version)))
                continue
            k = row.handle.params.logprobs or 0
            top = tuple(zip(top_ids[i][:k], top_vals[i][:k], strict=True)) if k else ()
            self._record(row, int(token), float(lp), top, version, outbox)
        _deliver(outbox)
        keep = [i for i, row in enumerate(rows) if not row.done]
        next_ids = [rows[i].out_ids[-1] for i in keep]
        if len(keep) < len(rows):
            batch.select(keep)
        if not batch.rows:
            return
        assert batch.mask is not None and batch.last_pos is not None
        batch.mask = torch.cat([batch.mask, torch.ones((len(keep), 1), dtype=torch.long)], dim=1)
        batch.last_pos = batch.last_pos + 1
        out = self._model(
            input_ids=torch.tensor(next_ids, dtype=torch.long).unsqueeze(1),
            attention_mask=batch.mask if bool((batch.mask == 0).any()) else None,
            position_ids=batch.last_pos.unsqueeze(1),
            cache=batch.cache,
            use_cache=True,
        )
        batch.logits = out.logits[:, -1, :].float()

    def _record(
        self,
        row: _Row,
        token: int,
        lp: float,
        top: tuple[tuple[int, float], ...],
        version: int,
        outbox: list[tuple[GenerationHandle, _Item]],
    ) -> None:
        params = row.handle.params
        row.out_ids.append(token)
        self.stats["tokens"] += 1
        outbox.append((row.handle, TokenEvent(token, lp, top, version)))
        finish: Finish | None = None
        if token in params.stop_token_ids:
            finish = Finish("stop", token, version)
        elif not params.ignore_eos and token in self.eos_token_ids:
            finish = Finish("stop", None, version)
        elif params.stop:
            # Only the tail can contain a newly completed stop string; decode a bounded window.
            window = self.tokenizer.decode(row.out_ids[-64:], skip_special_tokens=True)
            hit = next((s for s in params.stop if s in window), None)
            if hit is not None:
                finish = Finish("stop", hit, version)
        if finish is None and len(row.out_ids) >= params.max_tokens:
            finish = Finish("length", None, version)
        if finish is not None:
            row.done = True
            outbox.append((row.handle, finish))


def _deliver(outbox: list[tuple[GenerationHandle, _Item]]) -> None:
    """Hand a step's events to their event loops: one wake-up per loop per step, not one per token."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[GenerationHandle, _Item]]] = {}
    for handle, item in outbox:
        by_loop.setdefault(handle._loop, []).append((handle, item))
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening any more
            loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[GenerationHandle, _Item]]) -> None:
    for handle, item in items:
        handle._queue.put_nowait(item)
