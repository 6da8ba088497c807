"""The training step and checkpoints on a tiny real model (CPU, fp32)."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from contracts import to_ipc
from learner import BatchError, CheckpointMismatchError, Learner, LearnerSettings, train_files
from learner.checkpoint import check_compatible, latest_checkpoint, list_checkpoints, read_state

from .synthetic import per_request_rows, prefix_merging_rows, save_tiny_model, synthetic_sessions


def write_batches(tmp_path, n=3, builder=per_request_rows, seed=0, version=0, prefix="batch"):
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        rows = builder(synthetic_sessions(2, 3, 2, rng, version=version))
        p = tmp_path / f"{prefix}-{i}.arrow"
        p.write_bytes(to_ipc(rows))
        paths.append(p)
    return paths


def settings(model_dir, ckpt_dir, **kw):
    base = dict(model_dir=model_dir, checkpoint_dir=ckpt_dir, lr=1e-3, kl_coef=0.0, micro_batch_tokens=4096)
    return LearnerSettings(**{**base, **kw})


def weights(path):
    return load_file(str(path / "model.safetensors"))


def assert_same_weights(a, b, atol=0.0):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=atol, msg=k)


def test_steps_publish_versions_as_loadable_checkpoints(tiny_model_dir, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    (base / "tokenizer_config.json").write_text("{}")  # tokenizer files travel with every version
    batches = write_batches(tmp_path, n=2)
    results = train_files(settings(base, tmp_path / "ckpt"), batches)
    assert [r.version for r in results] == [1, 2]
    assert all(r.applied for r in results)
    v2 = results[-1].checkpoint
    assert v2 is not None and v2.name == "v00000002"
    assert (v2 / "tokenizer_config.json").exists()
    assert json.loads((v2 / "floe.json").read_text())["version"] == 2
    state = read_state(v2)
    assert state.applied_batches == ["batch-0", "batch-1"] and state.step == 2 and state.version == 2
    model = AutoModelForCausalLM.from_pretrained(str(v2))  # the format inference loads
    base_model = AutoModelForCausalLM.from_pretrained(str(base))
    changed = [not torch.equal(p, q) for p, q in zip(model.parameters(), base_model.parameters(), strict=True)]
    assert all(changed), "every parameter moved"
    m = results[-1].metrics
    for key in (
        "loss",
        "clip_frac",
        "kl",
        "ratio_mean",
        "logprob_gap_mean",
        "tokens_per_s",
        "step_time_s",
        "staleness_mean",
        "grad_norm",
    ):
        assert key in m
    assert m["staleness_max"] == 1.0  # batch-1 was sampled by version 0, trained at version 1


def test_micro_batching_does_not_change_the_update(tiny_model_dir, tmp_path):
    # Adam normalises each coordinate, so a gradient of +1e-12 vs -1e-12 would move a weight by +-lr; a large eps
    # makes the update linear in the gradient, so comparing weights compares gradients.
    batches = write_batches(tmp_path, n=1)
    linear = dict(adam_eps=1.0, lr=1.0, weight_decay=0.0)
    one = train_files(settings(tiny_model_dir, tmp_path / "one", micro_batch_tokens=100_000, **linear), batches)
    many = train_files(settings(tiny_model_dir, tmp_path / "many", micro_batch_tokens=128, **linear), batches)
    assert many[0].metrics["micro_batches"] > 4 * one[0].metrics["micro_batches"]
    assert one[0].metrics["loss"] == pytest.approx(many[0].metrics["loss"], rel=1e-5)
    assert_same_weights(one[0].checkpoint, many[0].checkpoint, atol=1e-6)


def test_masked_positions_cannot_influence_the_update(tiny_model_dir, tmp_path):
    rows = prefix_merging_rows(synthetic_sessions(2, 3, 3, random.Random(5)))
    garbage = []
    for r in rows:
        lps = tuple(lp if m else 77.0 for lp, m in zip(r.logprobs, r.loss_mask, strict=True))
        versions = tuple(v if m else 12345 for v, m in zip(r.weight_versions, r.loss_mask, strict=True))
        garbage.append(replace(r, logprobs=lps, weight_versions=versions))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.arrow").write_bytes(to_ipc(rows))
    (tmp_path / "b" / "x.arrow").write_bytes(to_ipc(garbage))
    ra = train_files(settings(tiny_model_dir, tmp_path / "ca", kl_coef=0.01), [tmp_path / "a" / "x.arrow"])
    rb = train_files(settings(tiny_model_dir, tmp_path / "cb", kl_coef=0.01), [tmp_path / "b" / "x.arrow"])
    assert_same_weights(ra[0].checkpoint, rb[0].checkpoint, atol=0.0)


def test_restart_resumes_exactly_and_skips_applied_batches(tiny_model_dir, tmp_path):
    batches = write_batches(tmp_path, n=3)
    straight = train_files(settings(tiny_model_dir, tmp_path / "straight"), batches)
    first = train_files(settings(tiny_model_dir, tmp_path / "resumed"), batches[:1])
    assert first[0].version == 1
    # Simulate a crash that left a half-written next version behind, then restart with a redelivery of batch-0.
    (tmp_path / "resumed" / ".tmp-v00000002-999").mkdir()
    (tmp_path / "resumed" / ".tmp-v00000002-999" / "model.safetensors").write_bytes(b"partial")
    again = train_files(settings(tiny_model_dir, tmp_path / "resumed"), batches)
    assert [(r.batch_id, r.applied, r.version) for r in again] == [
        ("batch-0", False, 1),
        ("batch-1", True, 2),
        ("batch-2", True, 3),
    ]
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "resumed").iterdir())
    final = latest_checkpoint(tmp_path / "resumed")
    assert final is not None and read_state(final).applied_batches == ["batch-0", "batch-1", "batch-2"]
    # Same weights *and* optimizer state as the uninterrupted run: the update sequence is identical.
    assert_same_weights(straight[-1].checkpoint, final, atol=1e-7)


def test_checkpoints_are_pruned_and_incomplete_dirs_ignored(tiny_model_dir, tmp_path):
    batches = write_batches(tmp_path, n=4)
    train_files(settings(tiny_model_dir, tmp_path / "ckpt", keep_checkpoints=2), batches)
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["v00000003", "v00000004"]
    (tmp_path / "ckpt" / "v00000009").mkdir()  # no learner_state.json: not a checkpoint
    latest = latest_checkpoint(tmp_path / "ckpt")
    assert latest is not None and latest.name == "v00000004"


def test_batch_without_trainable_tokens_makes_a_version_with_the_same_weights(tiny_model_dir, tmp_path):
    # One version per batch, trained or not: the rollout's lag bound waits for it (a stall otherwise).
    stale = write_batches(tmp_path, n=1, version=0, prefix="stale")
    fresh = write_batches(tmp_path, n=1, seed=1, prefix="fresh")
    s = settings(tiny_model_dir, tmp_path / "ckpt", max_staleness=0)
    results = train_files(s, [fresh[0], stale[0]])  # after one step the learner is at v1, batch sampled by v0
    assert [(r.applied, r.advanced, r.version) for r in results] == [(True, True, 1), (False, True, 2)]
    assert results[1].metrics["tokens_dropped_stale"] > 0 and results[1].metrics["batch_skipped"] == 1.0
    v1, v2 = (r.checkpoint for r in results)
    assert v1 is not None and v2 is not None and v2.name == "v00000002"
    state = read_state(v2)
    assert (state.version, state.step, state.applied_batches) == (2, 1, [fresh[0].stem, stale[0].stem])
    a, b = load_file(str(v1 / "model.safetensors")), load_file(str(v2 / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the weights did not move
    # A redelivery of the skipped batch (a crash before its offset was committed) makes no second version.
    again = train_files(s, [stale[0]])
    assert [(r.applied, r.advanced, r.version) for r in again] == [(False, False, 2)]


def test_kl_is_zero_at_the_reference_then_grows(tiny_model_dir, tmp_path):
    batches = write_batches(tmp_path, n=2)
    res = train_files(settings(tiny_model_dir, tmp_path / "ckpt", kl_coef=0.01), batches)
    assert res[0].metrics["kl"] == 0.0
    assert res[1].metrics["kl"] > 0.0


def test_several_optimizer_steps_per_batch_engage_the_clip(tiny_model_dir, tmp_path):
    batches = write_batches(tmp_path, n=1)
    s = settings(tiny_model_dir, tmp_path / "ckpt", optimizer_steps_per_batch=4, micro_batch_tokens=256, lr=0.05)
    (res,) = train_files(s, batches)
    assert res.version == 1
    assert res.metrics["clip_frac"] > 0.0
    assert res.metrics["finite"] == 1.0
    state = json.loads((res.checkpoint / "learner_state.json").read_text())
    assert state["step"] == 1


def test_a_checkpoint_with_other_shapes_is_refused_naming_both(tiny_model_dir, tmp_path):
    check_compatible(tiny_model_dir, tiny_model_dir)
    wider = save_tiny_model(tmp_path / "wider", hidden_size=48)  # same architecture, other shapes
    with pytest.raises(CheckpointMismatchError, match=r"hidden_size: 48 \(checkpoint\) vs 32 \(base model\)") as err:
        check_compatible(tiny_model_dir, wider)
    assert str(tiny_model_dir) in str(err.value) and str(wider) in str(err.value)
    with pytest.raises(CheckpointMismatchError, match="unreadable model config"):
        check_compatible(tiny_model_dir, tmp_path / "nowhere")


def test_a_batch_from_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    learner = Learner(settings(tiny_model_dir, tmp_path / "ckpt"))
    rows = per_request_rows(synthetic_sessions(1, 2, 1, random.Random(0), vocab_size=100))  # the model has 64 ids
    with pytest.raises(BatchError, match=r"outside the vocabulary .* \(ids 0\.\.63\)"):
        learner.step("foreign", to_ipc(rows))
    assert learner.version == 0 and not learner.already_applied("foreign")


def test_bf16_is_off_on_a_cpu_unless_asked(tiny_model_dir, tmp_path):
    assert not Learner(settings(tiny_model_dir, tmp_path / "a")).bf16
    learner = Learner(settings(tiny_model_dir, tmp_path / "b", bf16=True))
    assert learner.bf16 and {p.dtype for p in learner.model.parameters()} == {torch.float32}  # master weights
    (res,) = [learner.step("b", to_ipc(per_request_rows(synthetic_sessions(1, 2, 1, random.Random(0)))))]
    assert res.applied and res.metrics["finite"] == 1.0


def _zero_advantage(rows, groups):
    return [replace(r, advantage=0.0, reward=1.0) if r.group_id in groups else r for r in rows]


def test_rows_of_all_equal_groups_are_skipped_and_the_update_is_the_same(tiny_model_dir, tmp_path):
    rows = per_request_rows(synthetic_sessions(3, 3, 2, random.Random(7)))
    first = sorted({r.group_id for r in rows})[0]
    (tmp_path / "x.arrow").write_bytes(to_ipc(_zero_advantage(rows, {first})))
    # A large Adam eps makes the update linear in the gradient (see the micro-batching test): weights compare grads.
    linear = dict(adam_eps=1.0, lr=1.0, weight_decay=0.0)
    skip = train_files(settings(tiny_model_dir, tmp_path / "skip", **linear), [tmp_path / "x.arrow"])
    full = train_files(
        settings(tiny_model_dir, tmp_path / "full", skip_zero_advantage_rows=False, **linear), [tmp_path / "x.arrow"]
    )
    zero_rows = sum(r.group_id == first for r in rows)
    assert skip[0].metrics["rows_skipped_zero_advantage"] == zero_rows > 0
    assert full[0].metrics["rows_skipped_zero_advantage"] == 0
    assert skip[0].metrics["rows_trained"] == full[0].metrics["rows_trained"] - zero_rows
    assert skip[0].metrics["tokens_trainable"] == full[0].metrics["tokens_trainable"]  # the normaliser is unchanged
    assert skip[0].metrics["loss"] == pytest.approx(full[0].metrics["loss"], rel=1e-5)
    assert_same_weights(skip[0].checkpoint, full[0].checkpoint, atol=1e-6)
    # With a KL term every row has a gradient: nothing is skipped.
    kl = train_files(settings(tiny_model_dir, tmp_path / "kl", kl_coef=0.01, **linear), [tmp_path / "x.arrow"])
    assert kl[0].metrics["rows_skipped_zero_advantage"] == 0


def test_a_batch_without_signal_makes_a_version_with_unchanged_weights(tiny_model_dir, tmp_path):
    signal = write_batches(tmp_path, n=1)[0]
    rows = per_request_rows(synthetic_sessions(2, 3, 2, random.Random(3)))
    (tmp_path / "none.arrow").write_bytes(to_ipc(_zero_advantage(rows, {r.group_id for r in rows})))
    batches = [signal, tmp_path / "none.arrow"]
    skip = train_files(settings(tiny_model_dir, tmp_path / "skip"), batches)
    assert [r.version for r in skip] == [1, 2]
    assert not skip[1].applied and skip[1].metrics["batch_skipped"] == skip[1].metrics["batch_without_signal"] == 1.0
    # No AdamW step: the momentum of the first batch does not move the weights again.
    assert_same_weights(skip[0].checkpoint, skip[1].checkpoint, atol=0.0)
    # step_without_signal: AdamW steps on the zero gradient, as it does when the rows are computed.
    step = train_files(settings(tiny_model_dir, tmp_path / "step", step_without_signal=True), batches)
    full = train_files(settings(tiny_model_dir, tmp_path / "full", skip_zero_advantage_rows=False), batches)
    assert [r.version for r in step] == [r.version for r in full] == [1, 2]
    assert step[1].metrics["rows_trained"] == 0 and step[1].metrics["grad_norm"] == 0.0
    assert_same_weights(step[1].checkpoint, full[1].checkpoint, atol=1e-6)
    with pytest.raises(AssertionError):
        assert_same_weights(step[0].checkpoint, step[1].checkpoint)
