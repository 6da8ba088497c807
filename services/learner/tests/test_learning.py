"""The learner learns: a tiny random model, a toy verifiable task, samples drawn from the model itself.

Task ("copy"): the prompt is ``[0, a]`` with ``a`` in 2..9; the policy samples 4 tokens from a 16-token vocabulary;
reward = fraction of sampled tokens equal to ``a``. A random-init model scores ~1/16. Each step samples 8 prompts x a
group of 8 with torch (recording each sampled token's logprob and the weight version), builds Arrow rows with
leave-one-out group advantages, and applies them with ``Learner.step`` — the same path a Kafka batch takes.

Measured on the 2-core dev machine (seed 0, one thread, lr 1e-2): mean reward over the first 10 steps 0.09, over
the last 10 of 100 steps ~0.45 (150 steps plateau near 0.5); ~8 s of training, ~20 s with imports.
"""

from __future__ import annotations

import time

import pytest
import torch

from contracts import group_advantages, to_ipc
from learner import Learner, LearnerSettings

from .synthetic import save_tiny_model, trajectory_row

VOCAB, RESPONSE_LEN, PROMPTS, GROUP, STEPS = 16, 4, 8, 8, 100


@torch.no_grad()
def sample(model, prompts: torch.Tensor, n_new: int, gen: torch.Generator):
    """Ancestral sampling at temperature 1; returns (tokens (B, n_new), logprobs (B, n_new))."""
    seq = prompts
    toks, lps = [], []
    for _ in range(n_new):
        logits = model(input_ids=seq).logits[:, -1, :].float()
        logp = torch.log_softmax(logits, dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen)  # (B, 1)
        toks.append(nxt)
        lps.append(logp.gather(-1, nxt))
        seq = torch.cat([seq, nxt], dim=1)
    return torch.cat(toks, 1), torch.cat(lps, 1)


@pytest.mark.slow
def test_reward_rises_on_a_toy_copy_task(tmp_path):
    torch.manual_seed(0)
    model_dir = save_tiny_model(tmp_path / "model", vocab_size=VOCAB, hidden_size=32, num_layers=2, seed=0)
    settings = LearnerSettings(
        model_dir=model_dir, checkpoint_dir=tmp_path / "ckpt", lr=1e-2, kl_coef=0.0, weight_decay=0.0,
        max_grad_norm=1.0, loss_agg="token-mean",
    )  # fmt: skip
    learner = Learner(settings)
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    rewards = []
    for step in range(STEPS):
        targets = torch.randint(2, 10, (PROMPTS,), generator=gen).repeat_interleave(GROUP)  # (B,)
        prompts = torch.stack([torch.zeros_like(targets), targets], dim=1)  # (B, 2)
        tokens, logprobs = sample(learner.model, prompts, RESPONSE_LEN, gen)
        reward = (tokens == targets[:, None]).float().mean(dim=1)  # (B,)
        sessions = [f"{step}-{i}" for i in range(len(reward))]
        groups = [f"{step}-{i // GROUP}" for i in range(len(reward))]
        # The rollout's advantage function, leave-one-out, one group of GROUP sessions at a time.
        per_group = reward.view(PROMPTS, GROUP).tolist()
        adv = [a for r in per_group for a in group_advantages(r, [True] * GROUP, "loo").advantages]
        rows = [
            trajectory_row(session_id=sessions[i], group_id=groups[i], prompt=prompts[i].tolist(),
                           response=tokens[i].tolist(), response_mask=[1] * RESPONSE_LEN,
                           response_logprobs=logprobs[i].tolist(), response_versions=[learner.version] * RESPONSE_LEN,
                           reward=float(reward[i]), advantage=adv[i])
            for i in range(len(reward))
        ]  # fmt: skip
        result = learner.step(f"step-{step}", to_ipc(rows))
        rewards.append(float(reward.mean()))
        if not result.applied:
            # Every group all-equal (late in the run, all copied right): no signal, so no update and no forward.
            assert result.metrics["batch_without_signal"] == 1.0 and all(a == 0.0 for a in adv)
            continue
        # On-policy: the sampler is the learner, so the learner/sampler log-prob gap is float noise.
        assert abs(result.metrics["logprob_abs_gap_mean"]) < 1e-4
    elapsed = time.perf_counter() - t0
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"copy task: reward {first:.3f} -> {last:.3f} in {len(rewards)} steps, {elapsed:.1f}s")
    print([round(sum(rewards[i : i + 10]) / 10, 2) for i in range(0, len(rewards), 10)])
    assert first < 0.15
    assert last > 0.3, rewards
    assert last > 3 * first
