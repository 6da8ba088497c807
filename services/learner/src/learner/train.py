"""The learner: GRPO on trajectory batches from Kafka, as one top-to-bottom loop.

    for each TrajectoryBatch on floe.trajectory-batches (one partition, in order):
        skip it if its batch_id is in the checkpoint ledger         (a redelivery after a crash)
        Arrow -> drop stale tokens -> global loss weights -> micro-batches           data.py
        per micro-batch: forward, GRPO loss, backward; clip grads; AdamW step         model.py, grpo.py
        write checkpoint v+1 atomically: weights, optimizer, ledger                   checkpoint.py
        publish WeightsPublished(v+1, uri=<checkpoint dir>)
        commit the Kafka offset

Versions: the base model is version 0 and **every batch taken off the topic produces the next version**. A batch
that leaves nothing to train (every token masked or stale) or that is rejected (unreadable, another tokenizer's ids:
dead-lettered), or whose every row has advantage 0 (no KL term: a zero gradient, ``step_without_signal``), is
recorded in the ledger and makes a version with unchanged weights (``metrics["batch_skipped"]``),
so ``step`` (optimizer updates) can lag ``version``. Why: the rollout paces admission by the learner's version (one
per batch it published, ``rollout.scheduler``); a batch that made no version would hold its lag bound shut for good.
That happened: sessions cut off by a broker outage were all masked, and the run stalled. On start the learner
resumes from the newest complete checkpoint and publishes it again (idempotent: the topic is compacted and
engines ignore versions they already have), so a crash between checkpoint and publish loses nothing.

Exactly-once application: the checkpoint that contains a batch's update also contains its id in the ledger, and
the Kafka offset is committed only after that checkpoint is on disk. A crash before the checkpoint redelivers the
batch and it is applied to the previous weights; a crash after it redelivers the batch and the ledger skips it.
For the same reason a failed offset commit is only a warning: the batch comes again and the ledger skips it. That
happens when a step outlasts ``max_step_s`` (librdkafka's ``max.poll.interval.ms``): the group drops the learner
and the commit answers UNKNOWN_MEMBER_ID.

Distributed (torchrun): rank 0 consumes Kafka and broadcasts each batch's Arrow bytes; every rank decodes the
whole batch (so loss weights are global), trains on its share of micro-batches under DDP or FSDP2, and rank 0
writes checkpoints and publishes. ``train_files`` runs the same step on Arrow files without Kafka (benchmarks,
the distributed equivalence test, offline replays).

The objective and every deviation from textbook GRPO are documented in ``learner.grpo``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from contracts import DEAD_LETTER, TRAJECTORY_BATCHES, WEIGHTS, DeadLetter, TrajectoryBatch, WeightsPublished, encode
from contracts.errors import ContractError
from learner import checkpoint as ckpt
from learner.data import BatchError, batch_payload, decode_sequences, microbatches, prepare
from learner.distributed import (
    DistInfo,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    broadcast_object,
    init_distributed,
    unwrap,
    wrap_model,
)
from learner.grpo import policy_loss
from learner.model import autocast, load_causal_lm, target_logprobs
from learner.settings import LearnerSettings

if TYPE_CHECKING:
    from eventbus import KafkaSettings

__all__ = ["BusyClock", "Learner", "StepResult", "serve", "train_files"]

log = structlog.get_logger()


@dataclass(frozen=True)
class StepResult:
    batch_id: str
    applied: bool  # False: already in the ledger, nothing trainable left, or rejected
    version: int  # the learner's version after this batch
    advanced: bool = False  # this batch made a new version (applied, or skipped with unchanged weights)
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None  # set once saved (rank 0 only)


class Learner:
    """The policy, its optimizer and the ledger; ``step`` applies one batch, ``save`` writes a checkpoint."""

    def __init__(self, settings: LearnerSettings, info: DistInfo | None = None) -> None:
        self.settings = s = settings
        self.info = info = info or init_distributed(s.device)
        self.bf16 = s.bf16 if s.bf16 is not None else info.device.type == "cuda"
        grad_ckpt = s.gradient_checkpointing if s.gradient_checkpointing is not None else info.device.type == "cuda"
        self.loss_cfg = s.loss_config()
        torch.manual_seed(s.seed)

        ckpt.wait_for_model(s.model_dir, s.model_wait_s)
        # Resume from the newest complete checkpoint, or start from the base model as version 0.
        if info.is_main:
            ckpt.clean_temp(s.checkpoint_dir)
        barrier(info)
        resume = ckpt.latest_checkpoint(s.checkpoint_dir)
        if resume is not None:
            ckpt.check_compatible(s.model_dir, resume)  # before loading: a clear error, not a shape error in torch
        self.state = ckpt.read_state(resume) if resume else ckpt.LearnerState(base_model=str(s.model_dir))
        self._applied = set(self.state.applied_batches)
        self.last_checkpoint = resume

        model = load_causal_lm(resume or s.model_dir, info.device, gradient_checkpointing=grad_ckpt)
        model.train()
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)  # type: ignore[operator]
        self.model = wrap_model(model, info, s.strategy, self.bf16)
        self.ref: nn.Module | None = None
        if s.kl_coef > 0:
            ref = load_causal_lm(s.model_dir, info.device)  # frozen version-0 policy
            ref.eval().requires_grad_(False)
            self.ref = wrap_model(ref, info, "fsdp", self.bf16) if s.strategy == "fsdp" and info.distributed else ref
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=s.lr, betas=s.betas, eps=s.adam_eps, weight_decay=s.weight_decay, foreach=True
        )
        if resume is not None:
            state = torch.load(resume / ckpt.OPTIMIZER_FILE, map_location="cpu", weights_only=True)
            set_optimizer_state_dict(
                self.model, self.optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True)
            )
        log.info(
            "learner ready",
            version=self.state.version,
            step=self.state.step,
            resumed_from=str(resume) if resume else None,
            world_size=info.world_size,
            device=str(info.device),
            bf16=self.bf16,
            gradient_checkpointing=grad_ckpt,
        )

    @property
    def version(self) -> int:
        return self.state.version

    def already_applied(self, batch_id: str) -> bool:
        return batch_id in self._applied

    # ---------------------------------------------------------------------------------------------- the step

    def step(self, batch_id: str, payload: bytes | memoryview) -> StepResult:
        """Apply one batch (identical ``payload`` on every rank). Collective: every rank must call it."""
        s, info = self.settings, self.info
        if self.already_applied(batch_id):
            log.info("batch already applied, skipping", batch_id=batch_id, version=self.version)
            return StepResult(batch_id=batch_id, applied=False, version=self.version)
        t0 = time.perf_counter()
        log.info("train step started", batch_id=batch_id, step=self.state.step + 1, version=self.version)

        # 1. Data: decode, drop stale tokens, global aggregation weights, this rank's micro-batches.
        seqs = decode_sequences(payload, batch_id)
        if seqs.tokens.numel() and not 0 <= int(seqs.tokens.min()) <= int(seqs.tokens.max()) < self.vocab_size:
            # Ids from another tokenizer: refuse the batch (it is dead-lettered) instead of an index error in torch.
            bad = int(seqs.tokens.max()) if int(seqs.tokens.min()) >= 0 else int(seqs.tokens.min())
            raise BatchError(
                f"batch {batch_id}: token id {bad} is outside the vocabulary of {s.model_dir} "
                f"(ids 0..{self.vocab_size - 1}); the batch was tokenized for another model"
            )
        # Rows of all-equal groups carry no gradient without a KL term: skipped. While other rows have signal the
        # optimizer steps as it would have with them; a batch with none left makes no update (step_without_signal).
        skip_zero = s.skip_zero_advantage_rows and self.ref is None and s.optimizer_steps_per_batch == 1
        batch = prepare(seqs, self.version, s.max_staleness, s.loss_agg, s.max_seq_len, skip_zero)
        if not batch.stats["tokens_trainable"]:
            # Nothing trainable (all stale / masked): no update, but a version all the same (module docstring).
            # Deterministic, so a redelivery after a crash makes the same decision even before the ledger is persisted.
            log.warning("batch has no trainable tokens, skipped", batch_id=batch_id, **batch.stats)
            return self.skip(batch_id, batch.stats)
        if skip_zero and not batch.rows and not s.step_without_signal:
            # Every group all-equal: the gradient is exactly 0, and an AdamW step would only replay the momentum of
            # earlier batches (0.67 x lr x sign(g) the step after a lone signal, ~4.5 x over the next 11 such steps).
            # At the untrained model's ~2 % solve rate that turned one noisy batch into the whole run's update: a CI
            # demo went 0.025 -> 0.0 held-out with 11 signal-free steps after one. No update; a version all the same.
            log.info("batch has no signal (every advantage 0), no update", batch_id=batch_id, **batch.stats)
            return self.skip(batch_id, {**batch.stats, "batch_without_signal": 1.0})
        local = microbatches(batch, s.micro_batch_tokens, info.rank, info.world_size, s.micro_batch_layout)
        mbs = [mb.to(info.device) for mb in local]

        # 2. Proximal logprobs: with one optimizer step per batch they are the live logprobs, detached (free).
        #    With k > 1 steps the later steps need the logprobs of the weights *before* the first one.
        k = s.optimizer_steps_per_batch
        prox: list[torch.Tensor | None] = [None] * len(mbs)
        if k > 1:
            with torch.no_grad(), autocast(info.device, self.bf16):
                prox = [target_logprobs(self.model, mb, s.temperature) for mb in mbs]
        chunks = [list(range(j, len(mbs), k)) for j in range(k)]
        chunks = [c for c in chunks if c]  # identical on every rank: all ranks hold the same number of micro-batches

        # 3. Forward / loss / backward per micro-batch, one optimizer step per chunk.
        sums: dict[str, torch.Tensor] = {}
        rho_max = 0.0
        grad_norms: list[float] = []
        tokens_local = slots_local = 0
        for chunk in chunks:
            scale = len(mbs) / len(chunk)  # a chunk holds ~1/k of the batch's weight; keep the loss scale
            for n, i in enumerate(chunk):
                mb = mbs[i]
                with self._grad_sync(last=n == len(chunk) - 1), autocast(info.device, self.bf16):
                    logprobs = target_logprobs(self.model, mb, s.temperature)  # (B, T-1)
                    ref_lp = None
                    if self.ref is not None:
                        with torch.no_grad():
                            ref_lp = target_logprobs(self.ref, mb, s.temperature)
                    loss, stats = policy_loss(
                        logprobs,
                        mb.behav_logprobs,
                        mb.advantages,
                        mb.weights * scale,
                        mb.mask,
                        self.loss_cfg,
                        prox_logprobs=prox[i],
                        ref_logprobs=ref_lp,
                    )
                    # Weights are global, so the batch loss is the SUM over ranks; DDP/FSDP average gradients
                    # over ranks, which the factor world_size undoes.
                    (loss * info.world_size).backward()  # type: ignore[no-untyped-call]
                rho_max = max(rho_max, float(stats.pop("rho_max")))
                stats["pg_loss"] = stats["pg_loss"] / scale  # report the batch loss, not the rescaled chunk loss
                stats["kl_loss"] = stats["kl_loss"] / scale
                for key, v in stats.items():
                    sums[key] = sums.get(key, torch.zeros((), dtype=torch.float64, device=info.device)) + v.double()
                sums["loss"] = sums.get("loss", torch.zeros((), dtype=torch.float64, device=info.device)) + (
                    loss.detach().double() / scale
                )
                tokens_local += mb.num_tokens
                slots_local += mb.token_slots
            if s.debug_step_delay_s:
                time.sleep(s.debug_step_delay_s)  # test hook: makes "kill -9 during a step" deterministic
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.max_grad_norm)
            grad_norms.append(float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

        # 4. Bookkeeping and metrics (reduced over ranks).
        sums["tokens_processed"] = torch.tensor(float(tokens_local), dtype=torch.float64, device=info.device)
        sums["token_slots"] = torch.tensor(float(slots_local), dtype=torch.float64, device=info.device)
        red = all_reduce_sum(sums, info)
        rho_max = all_reduce_max(rho_max, info)
        elapsed = time.perf_counter() - t0
        n_tok = max(red["tokens"], 1.0)
        metrics = {
            **batch.stats,
            "loss": red["loss"],
            "pg_loss": red["pg_loss"],
            "kl_loss": red["kl_loss"],
            "kl": red["kl"] / n_tok,
            "clip_frac": red["clip_frac"] / n_tok,
            "ratio_mean": red["ratio"] / n_tok,
            "is_weight_mean": red["rho"] / n_tok,
            "is_weight_max": rho_max,
            "is_truncated_frac": red["rho_truncated_frac"] / n_tok,
            "logprob_gap_mean": red["logprob_gap"] / n_tok,
            "logprob_abs_gap_mean": red["logprob_abs_gap"] / n_tok,
            "learner_logprob_mean": red["logprob"] / n_tok,
            "sampler_logprob_mean": red["behav_logprob"] / n_tok,
            "grad_norm": grad_norms[-1],
            "grad_norm_max": max(grad_norms),
            "finite": float(all(math.isfinite(g) for g in grad_norms)),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "step_time_s": elapsed,
            "tokens_per_s": red["tokens_processed"] / elapsed,
            "trainable_tokens_per_s": red["tokens"] / elapsed,
            "micro_batches": float(len(mbs) * info.world_size),
            # Positions computed that hold no token (padded layout; the empty micro-batches that even out ranks).
            "padding_frac": 1.0 - red["tokens_processed"] / max(red["token_slots"], 1.0),
        }
        self.state.version += 1
        self.state.step += 1
        self.state.trained_batch = batch_id
        self.state.metrics = metrics
        self._record(batch_id)
        log.info("train step done", batch_id=batch_id, step=self.state.step, version=self.version, **metrics)
        return StepResult(batch_id=batch_id, applied=True, version=self.version, metrics=metrics, advanced=True)

    def skip(self, batch_id: str, metrics: dict[str, float] | None = None) -> StepResult:
        """Take ``batch_id`` without an update: ledger entry and a new version with the same weights (none for a
        batch already in the ledger). Every rank."""
        if self.already_applied(batch_id):
            return StepResult(batch_id=batch_id, applied=False, version=self.version)
        self.state.version += 1
        self.state.trained_batch = batch_id
        self.state.metrics = {**(metrics or {}), "batch_skipped": 1.0}
        self._record(batch_id)
        return StepResult(
            batch_id=batch_id, applied=False, version=self.version, metrics=self.state.metrics, advanced=True
        )

    def _record(self, batch_id: str) -> None:
        self._applied.add(batch_id)
        self.state.applied_batches.append(batch_id)

    def _grad_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Reduce gradients only on the last micro-batch of an optimizer step."""
        fsdp_sync: Any = getattr(self.model, "set_requires_gradient_sync", None)  # FSDP2
        if not self.info.distributed or last:
            if fsdp_sync is not None:
                fsdp_sync(True)
            return contextlib.nullcontext()
        if fsdp_sync is not None:
            fsdp_sync(False)
            return contextlib.nullcontext()
        no_sync: Any = getattr(self.model, "no_sync", None)  # DDP
        assert no_sync is not None, "a distributed model is wrapped in DDP or FSDP2"
        return no_sync()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------------------------------ checkpoint

    def save(self) -> Path | None:
        """Write the current version's checkpoint (collective); rank 0 returns its directory."""
        s, info = self.settings, self.info
        t0 = time.perf_counter()
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state: dict[str, Any] = dict(get_model_state_dict(self.model, options=opts))
        optim_state = get_optimizer_state_dict(self.model, self.optimizer, options=opts)
        path: Path | None = None
        if info.is_main:
            path = ckpt.save_checkpoint(
                s.checkpoint_dir, self.state, unwrap(self.model), model_state, optim_state, s.model_dir
            )
            ckpt.prune(s.checkpoint_dir, s.keep_checkpoints)
            log.info("checkpoint written", version=self.version, path=str(path), seconds=time.perf_counter() - t0)
        barrier(info)
        self.last_checkpoint = path
        return path

    def weights_event(self, extra: dict[str, float] | None = None) -> WeightsPublished:
        """The event for the newest checkpoint; ``extra`` adds metrics of this process (busy time, waits)."""
        assert self.last_checkpoint is not None, "save() before publishing"
        metrics = {k: v for k, v in {**self.state.metrics, **(extra or {})}.items() if math.isfinite(v)}
        return WeightsPublished(
            version=self.version,
            uri=str(self.last_checkpoint.resolve()),
            step=self.state.step,
            base_model=self.settings.policy_name,
            batch_id=self.state.trained_batch,
            metrics=metrics,
        )


@dataclass
class BusyClock:
    """How busy the learner is: time spent on batches (decode, train, checkpoint) against time spent waiting for one.

    Polar's headline number is this fraction (GPU utilisation 20.4 % -> 87.7 % with asynchronous collection). The
    clock starts when the first batch arrives (loading the model and the first sessions are not the learner's idle
    time) and every ``WeightsPublished`` carries it: ``learner_busy_fraction`` (since the first batch),
    ``learner_step_s`` (this batch, arrival to checkpoint) and ``learner_wait_s`` (idle before it arrived).
    """

    started: float | None = None
    busy_s: float = 0.0
    idle_since: float | None = None
    _batch_at: float = 0.0
    _waited: float = 0.0

    def batch_arrived(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.started is None:
            self.started = now
        self._waited = now - self.idle_since if self.idle_since is not None else 0.0
        self._batch_at = now

    def batch_done(self, now: float | None = None) -> dict[str, float]:
        assert self.started is not None, "batch_arrived() first"
        now = time.monotonic() if now is None else now
        step = now - self._batch_at
        self.busy_s += step
        self.idle_since = now
        window = now - self.started
        return {
            "learner_step_s": step,
            "learner_wait_s": self._waited,
            "learner_busy_s": self.busy_s,
            "learner_window_s": window,
            "learner_busy_fraction": self.busy_s / window if window > 0 else 1.0,
        }


# ------------------------------------------------------------------------------------------------ offline


def train_files(settings: LearnerSettings, paths: Iterable[Path], info: DistInfo | None = None) -> list[StepResult]:
    """Apply Arrow IPC batch files in order (batch id = file stem), checkpointing after each. Every rank calls it."""
    learner = Learner(settings, info)
    results = []
    for path in paths:
        result = learner.step(path.stem, path.read_bytes())
        if result.advanced:
            result = StepResult(**{**result.__dict__, "checkpoint": learner.save()})
        results.append(result)
    return results


# ------------------------------------------------------------------------------------------------- Kafka


async def serve(
    settings: LearnerSettings, stop: asyncio.Event | None = None, kafka: KafkaSettings | None = None
) -> None:
    """Run the learner against Kafka until ``stop`` is set (rank 0), or follow rank 0's broadcasts (other ranks)."""
    from eventbus import Consumer, EventBusError, KafkaSettings, Producer, ensure_topics

    learner = await asyncio.to_thread(Learner, settings)
    if not learner.info.is_main:
        await asyncio.to_thread(_follow, learner)
        return
    kafka = kafka or KafkaSettings()
    batches = TRAJECTORY_BATCHES.with_name(settings.trajectory_batches_topic)
    weights_topic = WEIGHTS.with_name(settings.weights_topic)
    await ensure_topics(kafka, [batches, weights_topic, DEAD_LETTER])
    stop = stop or asyncio.Event()
    try:
        async with (
            Producer(kafka) as producer,
            Consumer(
                kafka,
                [batches],
                group_id=settings.group_id,
                rejoin_after_s=settings.rejoin_after_s,
                sole_member=True,
                config={"max.poll.interval.ms": int(settings.max_step_s * 1000)},
            ) as consumer,
        ):

            async def commit(msg: Any) -> None:
                try:
                    await consumer.commit(msg)
                except EventBusError as exc:  # see the module docstring: the ledger makes a redelivery harmless
                    log.warning("offset commit failed; the batch will come again and be skipped", error=str(exc))

            if learner.last_checkpoint is not None:
                # Re-announce the version we resumed from: covers a crash between checkpoint and publish.
                await producer.send(weights_topic, learner.weights_event())
            clock = BusyClock()
            while not stop.is_set():
                msg = await consumer.next(timeout_s=0.5)
                if msg is None:
                    continue
                clock.batch_arrived()
                batch = msg.event
                structlog.contextvars.bind_contextvars(batch_id=batch.batch_id)
                try:
                    payload = batch_payload(batch)
                except BatchError as exc:
                    log.error("batch unreadable, dead-lettered", error=str(exc), offset=msg.offset)
                    await producer.send(DEAD_LETTER, _dead_letter(msg.topic, msg.partition, msg.offset, batch, exc))
                    broadcast_object(("skip", batch.batch_id), learner.info)
                    result = learner.skip(batch.batch_id, {"batch_rejected": 1.0})
                else:
                    broadcast_object(("batch", batch.batch_id, bytes(payload)), learner.info)
                    try:
                        result = await asyncio.to_thread(learner.step, batch.batch_id, payload)
                    except (ContractError, BatchError) as exc:
                        # Bad rows are data, not a crash: every rank failed the same way while decoding (and skips).
                        log.error("batch rejected, dead-lettered", error=str(exc), offset=msg.offset)
                        await producer.send(DEAD_LETTER, _dead_letter(msg.topic, msg.partition, msg.offset, batch, exc))
                        result = learner.skip(batch.batch_id, {"batch_rejected": 1.0})
                if result.advanced:
                    await asyncio.to_thread(learner.save)
                    busy = clock.batch_done()
                    await producer.send(weights_topic, learner.weights_event(busy))
                    log.info(
                        "weights published",
                        version=learner.version,
                        uri=str(learner.last_checkpoint),
                        step_s=round(busy["learner_step_s"], 3),
                        wait_s=round(busy["learner_wait_s"], 3),
                        busy_fraction=round(busy["learner_busy_fraction"], 4),
                    )
                else:
                    clock.batch_done()
                await commit(msg)
                structlog.contextvars.unbind_contextvars("batch_id")
    finally:
        broadcast_object(("stop",), learner.info)


def _follow(learner: Learner) -> None:
    """Ranks > 0: mirror rank 0's steps and saves until it says stop."""
    for batch_id, payload in _broadcasts(learner.info):
        if payload is None:  # rank 0 could not read the batch and skips it
            result = learner.skip(batch_id, {"batch_rejected": 1.0})
        else:
            try:
                result = learner.step(batch_id, payload)
            except (ContractError, BatchError):
                result = learner.skip(batch_id, {"batch_rejected": 1.0})  # rank 0 rejected it the same way
        if result.advanced:
            learner.save()


def _broadcasts(info: DistInfo) -> Iterator[tuple[str, bytes | None]]:
    """Rank 0's messages: ("batch", id, payload), ("skip", id) (yielded with payload None), ("stop",)."""
    while True:
        msg = broadcast_object(None, info)
        if msg[0] == "stop":
            return
        yield msg[1], (msg[2] if msg[0] == "batch" else None)


def _dead_letter(topic: str, partition: int, offset: int, batch: TrajectoryBatch, exc: Exception) -> DeadLetter:
    import base64

    return DeadLetter(
        source_topic=topic,
        partition=partition,
        offset=offset,
        key=batch.batch_id,
        value_b64=base64.b64encode(encode(batch)).decode(),
        error_type=type(exc).__name__,
        reason=str(exc)[:4000],
        consumer_group=None,
    )
