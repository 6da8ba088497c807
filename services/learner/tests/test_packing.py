"""Packed micro-batches (``micro_batch_layout="packed"``) against padded ones: the same per-sequence tensors, and the
same logprobs, loss and gradients from the model (fp32: to 1e-6; an fp64 model: to 1e-9), with sdpa (the learner's
``PACKED_SDPA``), eager (transformers' block mask) and a sliding window. SmolLM2: ``test_real_model.py``."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from contracts import to_ipc
from learner import train_files
from learner.data import MicroBatch, PreparedBatch, decode_sequences, microbatches, pack, prepare
from learner.grpo import LossConfig, policy_loss
from learner.model import PACKED_SDPA, load_causal_lm, target_logprobs

from .synthetic import per_request_rows, prefix_merging_rows, synthetic_sessions
from .test_train import assert_same_weights, settings, write_batches


def prepared(seed: int = 0, version: int = 0) -> PreparedBatch:
    """12 per-request rows of 73-154 tokens (2 groups x 3 sessions x 2 turns; a session's rows share a prefix)."""
    rows = per_request_rows(synthetic_sessions(2, 3, 2, random.Random(seed), version=version))
    return prepare(decode_sequences(to_ipc(rows)), version, None, "token-mean", 10_000)


def per_sequence(
    batch: PreparedBatch,
    budget: int,
    layout: str,
    mbs: list[MicroBatch],
    values: list[torch.Tensor],
    rank: int = 0,
    world_size: int = 1,
) -> dict[int, torch.Tensor]:
    """``{batch row: its T-1 target values}`` from micro-batch-shaped ``values`` (one (B, T-1) tensor per mb)."""
    groups = pack(batch.lengths, budget, layout)[rank::world_size]  # how microbatches() grouped them
    out: dict[int, torch.Tensor] = {}
    for items, mb, v in zip(groups, mbs, values, strict=False):  # the empty micro-batches come last
        if mb.packed:
            assert mb.cu_seq_lens is not None
            cu = mb.cu_seq_lens.tolist()
            assert len(cu) == len(items) + 1
            for s, i in enumerate(items):
                out[batch.rows[i]] = v[0, cu[s] : cu[s + 1] - 1]
        else:
            for j, i in enumerate(items):
                out[batch.rows[i]] = v[j, : batch.lengths[i] - 1]
    return out


@pytest.mark.parametrize("world_size", [1, 3])
def test_packed_micro_batches_hold_the_padded_ones_sequences_back_to_back(world_size):
    batch = prepared()
    budget = 400  # 2-5 sequences per packed row
    columns = ("mask", "behav_logprobs", "advantages", "weights", "versions", "input_ids")
    seen: dict[str, dict[str, dict[int, torch.Tensor]]] = {"padded": {}, "packed": {}}
    for layout, by_column in seen.items():
        counts = set()
        for rank in range(world_size):
            mbs = microbatches(batch, budget, rank, world_size, layout=layout)
            counts.add(len(mbs))
            for c in columns:
                values = [getattr(mb, c)[:, :-1] if c == "input_ids" else getattr(mb, c) for mb in mbs]
                by_column.setdefault(c, {}).update(per_sequence(batch, budget, layout, mbs, values, rank, world_size))
            if layout == "padded":
                continue
            real = [mb for mb in mbs if mb.num_tokens]
            assert all(mb.packed and mb.input_ids.shape[0] == 1 and mb.attention_mask is None for mb in real)
            for mb in real:
                assert mb.cu_seq_lens is not None and mb.position_ids is not None
                cu = mb.cu_seq_lens.tolist()
                assert cu[0] == 0 and cu[-1] == mb.num_tokens == mb.token_slots <= budget
                spans = list(itertools.pairwise(cu))
                expected_pos = torch.cat([torch.arange(hi - lo) for lo, hi in spans])
                assert torch.equal(mb.position_ids[0], expected_pos), "positions restart at 0 for every sequence"
                assert mb.max_length == max(hi - lo for lo, hi in spans)
                ends = torch.tensor(cu[1:-1]) - 1  # these positions would predict the next sequence's first token
                assert not mb.mask[0, ends].any() and torch.all(mb.weights[0, ends] == 0)
                assert torch.all(mb.behav_logprobs[0, ends] == 0) and torch.all(mb.versions[0, ends] == -1)
        assert len(counts) == 1, "every rank gets the same number of micro-batches"
    packed_rows = [mb for mb in microbatches(batch, budget, layout="packed") if mb.cu_seq_lens is not None]
    assert max(len(mb.cu_seq_lens) - 1 for mb in packed_rows if mb.cu_seq_lens is not None) > 1, "rows are shared"
    # Per sequence, every column (and the input ids) equals the padded layout's.
    for c in columns:
        want, got = seen["padded"][c], seen["packed"][c]
        assert want.keys() == got.keys() and len(want) == len(batch.rows)
        for r in want:
            assert torch.equal(got[r], want[r]), (c, r)
    total = sum(float(w.sum()) for w in seen["packed"]["weights"].values())
    assert total == pytest.approx(1.0, abs=1e-5)


def run_layout(model, batch: PreparedBatch, budget: int, layout: str, all_positions: bool):
    """Per-sequence logprobs, the summed loss and every parameter's gradient over the batch's micro-batches."""
    model.zero_grad(set_to_none=True)
    mbs = microbatches(batch, budget, layout=layout)
    lps, loss_sum = [], 0.0
    for mb in mbs:
        lp = target_logprobs(model, mb, temperature=0.7, all_positions=all_positions)
        # Behaviour logprobs off the learner's (a ratio that is not 1, clipping and truncation engaged).
        loss, _ = policy_loss(lp, mb.behav_logprobs - 0.3, mb.advantages, mb.weights, mb.mask, LossConfig())
        loss.backward()
        loss_sum += float(loss.detach())
        lps.append(lp.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return per_sequence(batch, budget, layout, mbs, lps), loss_sum, grads, len(mbs)


def assert_layouts_agree(model, batch, budget, all_positions=False, lp_atol=1e-6, grad_tol=1e-6, loss_atol=1e-7):
    lp_pad, loss_pad, g_pad, n_pad = run_layout(model, batch, budget, "padded", all_positions)
    lp_pack, loss_pack, g_pack, n_pack = run_layout(model, batch, budget, "packed", all_positions)
    assert n_pack <= n_pad
    assert lp_pad.keys() == lp_pack.keys() and len(lp_pad) == len(batch.rows)
    for r in lp_pad:
        assert bool((lp_pad[r] != 0).any()), "the comparison covers real logprobs"
        torch.testing.assert_close(lp_pack[r], lp_pad[r], rtol=0, atol=lp_atol, msg=f"row {r}")
    assert loss_pack == pytest.approx(loss_pad, abs=loss_atol) and loss_pad != 0
    assert g_pad.keys() == g_pack.keys() and len(g_pad) == len(list(model.parameters()))
    for name, g in g_pad.items():
        scale = float(g.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(g_pack[name], g, rtol=0, atol=grad_tol * scale, msg=name)


@pytest.mark.parametrize("budget", [100_000, 400])  # one micro-batch; several of 2-5 sequences each
@pytest.mark.parametrize("grad_ckpt", [False, True])
@pytest.mark.parametrize("all_positions", [False, True])
def test_packed_equals_padded_in_fp64_logprobs_loss_and_gradients(tiny_model_dir, budget, grad_ckpt, all_positions):
    model = load_causal_lm(tiny_model_dir, torch.device("cpu"), gradient_checkpointing=grad_ckpt).double().train()
    assert model.config._attn_implementation == PACKED_SDPA
    # An fp64 model; the log-softmax, the logprobs and the loss are fp32 (target_logprobs), so the gradients can
    # differ where an fp32 rounding flips (on SmolLM2: 2.4e-7 of a tensor's largest entry, as much as padded rows
    # split differently into micro-batches differ); on this model they agree to fp64 rounding (< 1e-13).
    assert_layouts_agree(model, prepared(), budget, all_positions, lp_atol=1e-6, grad_tol=1e-9, loss_atol=1e-8)


@pytest.mark.parametrize("budget", [100_000, 400])
def test_packed_equals_padded_in_fp32(tiny_model_dir, budget):
    model = load_causal_lm(tiny_model_dir, torch.device("cpu")).train()
    assert_layouts_agree(model, prepared(), budget)


def _qwen2(tmp_path, **kw):
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(str(tmp_path))
    return tmp_path


def test_packed_equals_padded_with_a_sliding_window(tmp_path):
    # Layer 1 attends to the last 16 positions only: PACKED_SDPA masks each sequence itself, padded rows get
    # transformers' sliding-window mask.
    path = _qwen2(tmp_path, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    model = load_causal_lm(path, torch.device("cpu")).double().train()
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    assert_layouts_agree(model, prepared(), 400, grad_tol=1e-9)
    # The window does change the result: without it the logprobs differ (the test above could not pass by accident).
    unwindowed = load_causal_lm(_qwen2(tmp_path / "full"), torch.device("cpu")).double().train()
    lp_win = run_layout(model, prepared(), 400, "packed", False)[0]
    lp_full = run_layout(unwindowed, prepared(), 400, "packed", False)[0]
    assert any(not torch.allclose(lp_win[r], lp_full[r]) for r in lp_win)


def test_packed_equals_padded_with_eager_attention(tiny_model_dir):
    # eager does not read cu_seq_lens: transformers builds the block-diagonal mask from the restarting position_ids.
    # Its softmax runs in fp32 whatever the model's dtype, and the packed row's longer (masked) key rows sum in
    # another order: the attention gradients then differ by ~1e-9 of their size in an fp64 model, fp32 rounding.
    model = load_causal_lm(tiny_model_dir, torch.device("cpu")).double().train()
    model.set_attn_implementation("eager")
    assert_layouts_agree(model, prepared(), 400, grad_tol=1e-7)


def test_packed_sdpa_keeps_sequences_apart_given_only_position_ids(tiny_model_dir):
    """transformers' padding-free convention (no cu_seq_lens): each run of position_ids is its own sequence; and
    what one sequence holds cannot change another's logits."""
    model = load_causal_lm(tiny_model_dir, torch.device("cpu")).double().eval()
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randint(2, 64, (1, 9), generator=gen), torch.randint(2, 64, (1, 5), generator=gen)
    pos = torch.cat([torch.arange(9), torch.arange(5)])[None]
    with torch.no_grad():
        packed = model(input_ids=torch.cat([a, b], 1), position_ids=pos, use_cache=False).logits
        alone = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits], 1)
        other = model(input_ids=torch.cat([a, b.flip(1)], 1), position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)
    torch.testing.assert_close(other[:, :9], packed[:, :9], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_the_learner_makes_the_same_update_packed_and_padded(tiny_model_dir, tmp_path, kl_coef):
    # Linear Adam (see test_train): equal weights after a step mean equal gradients. The KL reference is scored on
    # the same micro-batches; per_request rows from the same session have different lengths (padding).
    batches = write_batches(tmp_path, n=2)
    linear = dict(adam_eps=1.0, lr=1.0, weight_decay=0.0, kl_coef=kl_coef, micro_batch_tokens=400)
    results = {}
    for layout in ("packed", "padded"):
        s = settings(tiny_model_dir, tmp_path / layout, micro_batch_layout=layout, **linear)
        results[layout] = train_files(s, batches)
    packed, padded = results["packed"], results["padded"]
    for p, q in zip(packed, padded, strict=True):
        assert p.metrics["loss"] == pytest.approx(q.metrics["loss"], rel=1e-5)
        assert p.metrics["micro_batches"] < q.metrics["micro_batches"]
        assert p.metrics["padding_frac"] == 0.0 < q.metrics["padding_frac"]
    assert_same_weights(packed[-1].checkpoint, padded[-1].checkpoint, atol=1e-6)
    # The attention implementation is the learner's business: checkpoints stay plain models for the engines.
    config = json.loads((packed[-1].checkpoint / "config.json").read_text())
    assert PACKED_SDPA not in json.dumps(config)


def test_prefix_merged_rows_pack_too(tiny_model_dir):
    # One long row per session with masked tool tokens inside the response: still the padded layout's numbers.
    rows = prefix_merging_rows(synthetic_sessions(2, 3, 3, random.Random(4)))
    batch = prepare(decode_sequences(to_ipc(rows)), 0, None, "session-mean", 10_000)
    model = load_causal_lm(tiny_model_dir, torch.device("cpu")).double().train()
    assert_layouts_agree(model, batch, 600, grad_tol=1e-9)


def test_packed_sdpa_decodes_with_a_cache_as_sdpa_does(tiny_model_dir):
    # Not a learner path, but the implementation is swapped on the loaded model: generation (left padding, a cache,
    # single-query steps) must still be sdpa's.
    model = load_causal_lm(tiny_model_dir, torch.device("cpu")).eval()
    ids = torch.randint(2, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    attention[1, :2] = 0
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=attention).logits
        out = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=6, do_sample=False)
        model.set_attn_implementation("sdpa")
        torch.testing.assert_close(model(input_ids=ids, attention_mask=attention).logits, ours, rtol=0, atol=0)
        assert torch.equal(
            model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=6, do_sample=False), out
        )
