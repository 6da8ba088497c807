"""The learner on the real SmolLM2-135M-Instruct (Llama, tied embeddings; fp32 on CPU).

The model is the ``real_model_dir`` fixture of ``inference.testing``: fetched and converted on first use (what
``floe model fetch smollm2-135m`` does), verified against its manifest later. A missing or broken cache fails the
test with the command that repairs it (``floe model fetch smollm2-135m --force``); it is never skipped.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from contracts import to_ipc
from learner import CheckpointMismatchError, Learner, LearnerSettings, train_files
from learner.data import decode_sequences, prepare
from learner.model import PACKED_SDPA, load_causal_lm

from .synthetic import masked_micro_batch, per_request_rows, synthetic_sessions, trajectory_row
from .test_model import assert_paths_agree
from .test_packing import assert_layouts_agree

QUESTIONS = [("What is 2+3?", "5", 1.0), ("What is 2+3?", "six", -1.0), ("What is 4+4?", "8", 0.5)]


def smollm2_rows(model_dir):
    """Chat-templated prompts and answers in SmolLM2's own token ids (what the gateway would record)."""
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for i, (question, answer, advantage) in enumerate(QUESTIONS):
        chat = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        prompt = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
        response = [*tok.encode(answer, add_special_tokens=False), end]
        rows.append(
            trajectory_row(
                session_id=f"s{i}",
                group_id="g0",
                prompt=prompt,
                response=response,
                response_mask=[1] * len(response),
                response_logprobs=[-1.0] * len(response),
                response_versions=[0] * len(response),
                reward=max(advantage, 0.0),
                advantage=advantage,
            )
        )
    return rows


@pytest.mark.slow
def test_one_step_changes_the_weights_and_the_checkpoint_reloads_to_the_same_logits(real_model_dir, tmp_path):
    from inference.checkpoint import load_checkpoint  # the CPU engine's loader: what serves this checkpoint

    torch.set_num_threads(2)  # ~135M parameters: two threads beat one, unlike the tiny model (conftest)
    rows = smollm2_rows(real_model_dir)
    settings = LearnerSettings(
        model_dir=real_model_dir, checkpoint_dir=tmp_path / "ckpt", lr=1e-4, kl_coef=0.0, device="cpu"
    )
    learner = Learner(settings)
    assert not learner.bf16, "fp32 on a CPU unless bf16 is asked for"
    assert {p.dtype for p in learner.model.parameters()} == {torch.float32}

    result = learner.step("smollm2-0", to_ipc(rows))
    assert result.applied and result.version == 1
    assert math.isfinite(result.metrics["loss"]) and result.metrics["finite"] == 1.0
    path = learner.save()
    assert path is not None

    # Every tensor moved (AdamW's first step moves each coordinate by ~lr), and the checkpoint holds exactly the base
    # model's tensor names: the tied embedding once, so both engines load it as they load the base model.
    live = learner.model.state_dict()
    with (
        safe_open(str(real_model_dir / "model.safetensors"), "pt") as base,
        safe_open(str(path / "model.safetensors"), "pt") as saved,
    ):
        tensors = set(base.keys())
        assert set(saved.keys()) == tensors
        unchanged = [k for k in sorted(tensors) if torch.equal(base.get_tensor(k), live[k])]
        assert not unchanged, f"not updated: {unchanged}"
        assert all(torch.equal(saved.get_tensor(k), live[k]) for k in tensors)

    names = {p.name for p in path.iterdir()}
    expected = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert expected | {"generation_config.json", "floe.json", "optimizer.pt", "learner_state.json"} <= names
    assert "floe-model.json" not in names, "the model cache's manifest describes the base model's files only"
    assert (path / "chat_template.jinja").read_bytes() == (real_model_dir / "chat_template.jinja").read_bytes()

    ids = torch.tensor([rows[0].tokens])
    learner.model.eval()
    with torch.no_grad():
        expected_logits = learner.model(input_ids=ids).logits
        reloaded = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected_logits, rtol=0, atol=1e-5)
        del reloaded
        engine = load_checkpoint(path)
        assert engine.version == 1
        torch.testing.assert_close(engine.model(input_ids=ids).logits, expected_logits, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_trained_rows_only_equal_all_positions_on_smollm2(real_model_dir):
    """The demo's shape (~45-token prompts, a few sampled tokens): the tied head's rows and every gradient agree."""
    model = load_causal_lm(real_model_dir, torch.device("cpu")).train()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight, "SmolLM2 ties them"
    mb = masked_micro_batch([(45, 6), (47, 4), (41, 6)], vocab_size=49152, holes=True)
    # Bit-identical with one thread; with two, the (N, 576) x (576, 49152) head matmul splits its work differently
    # from the (B*T)-row one: logprobs (up to 24 in size) then differ by up to 1.5e-5, gradients by 1.4e-4 of their
    # largest entry (a norm weight's, 30 layers down): fp32 rounding.
    assert_paths_agree(model, mb, temperature=0.7, lp_atol=1e-4, grad_tol=1e-3)


@pytest.mark.slow
def test_packed_equals_padded_on_smollm2(real_model_dir):
    """Llama with grouped-query attention and a tied head: packed and padded micro-batches give the same logprobs,
    loss and gradients to fp32 rounding. Measured (1 or 2 threads): logprobs (up to ~24 in size) 1.7e-5 apart,
    gradients 3.4e-6 of each tensor's largest entry; the padded layout itself, split into one row per micro-batch
    instead of one micro-batch, moves them as much (1.7e-5; gradients 3.5e-6 with 1 thread, 3.2e-5 with 2)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for i, (p, c) in enumerate([(45, 6), (47, 4), (41, 6), (30, 20)]):
        ids = torch.randint(0, 49152, (p + c,), generator=gen).tolist()
        rows.append(
            trajectory_row(
                session_id=f"s{i}", group_id="g0", prompt=ids[:p], response=ids[p:], response_mask=[1] * c,
                response_logprobs=[-1.0] * c, response_versions=[0] * c, reward=float(i % 2), advantage=i % 2 - 0.5,
            )
        )  # fmt: skip
    batch = prepare(decode_sequences(to_ipc(rows)), 0, None, "token-mean", 10_000)
    model = load_causal_lm(real_model_dir, torch.device("cpu")).train()
    assert model.config._attn_implementation == PACKED_SDPA
    assert_layouts_agree(model, batch, 100_000, lp_atol=5e-5, grad_tol=2e-5, loss_atol=1e-11)


def test_resuming_a_checkpoint_of_another_architecture_is_refused_naming_both(real_model_dir, tiny_model_dir, tmp_path):
    batch = tmp_path / "tiny-0.arrow"
    batch.write_bytes(to_ipc(per_request_rows(synthetic_sessions(1, 2, 1, random.Random(0)))))
    ckpt_dir = tmp_path / "ckpt"
    (done,) = train_files(LearnerSettings(model_dir=tiny_model_dir, checkpoint_dir=ckpt_dir, kl_coef=0.0), [batch])
    assert done.checkpoint is not None
    # The same checkpoint dir, now with SmolLM2 as the base model: refused before any weights are loaded.
    with pytest.raises(CheckpointMismatchError) as err:
        Learner(LearnerSettings(model_dir=real_model_dir, checkpoint_dir=ckpt_dir, kl_coef=0.0))
    message = str(err.value)
    assert str(done.checkpoint) in message and str(real_model_dir) in message
    assert "Qwen2ForCausalLM" in message and "LlamaForCausalLM" in message
    assert "vocab_size: 64 (checkpoint) vs 49152 (base model)" in message
