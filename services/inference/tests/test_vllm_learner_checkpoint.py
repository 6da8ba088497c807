"""A checkpoint written by the learner's own code reloads into the real vLLM through the production reload path.

The learner (``learner.Learner``: its model loader, ``save`` and ``weights_event``) loads the real SmolLM2, whose
embeddings are tied: ``lm_head`` is ``model.embed_tokens`` and the checkpoint stores it once, under the embedding's
name. One embedding row (the token " banana") is set to a long vector along the final hidden state of the prompt's
last position, so greedy decoding must answer " banana" every time: its logit is ~1000 x |h| at the first position,
and once it is an input its embedding dominates the residual stream, so it wins again. That only happens in vLLM if
the reload reaches the output projection too (the tie), which no other test checks: vLLM 0.32's CPU build kept the
start weights in its lm_head until ``deploy/vllm/floe_cpu_reload.py`` (passed by serve.sh) rebuilt it after reloads.

The event goes to ``reloader.apply_weights_event`` with ``vllm_weights.VllmWeights`` as the target: exactly what the
``--engine vllm`` proxy does with each ``WeightsPublished`` from ``floe.weights`` (minus Kafka: covered by
``test_vllm_proxy``). Then the real model is published as the next version and must give the original tokens back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from contracts import WeightsPublished
from inference import InferenceSettings
from inference.reloader import apply_weights_event, read_version
from inference.testing import VllmServer
from inference.vllm_weights import Admission, VllmWeights, read_tensor_shapes
from learner import Learner, LearnerSettings
from learner.distributed import unwrap

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "What is 2+3? Answer with one number."}]
TARGET_WORD = " banana"
SCALE = 1000.0  # x the unit vector; SmolLM2's embedding rows have norms of 3 (mean) to 7.5 (max)
N_TOKENS = 8


async def greedy(c: httpx.AsyncClient, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    body = {
        "model": "policy",
        "prompt": prompt_ids,
        "max_tokens": N_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,  # always N_TOKENS tokens, so the two completions compare position by position
        "logprobs": 1,
        "return_token_ids": True,
    }
    r = await c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


async def tokens(c: httpx.AsyncClient, **body: Any) -> list[int]:
    r = await c.post("/tokenize", json={"model": "policy", **body})
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


async def weight_info(c: httpx.AsyncClient) -> str:
    return str((await c.get("/weight_info")).json()["weight_version"])


def hf_greedy(model: torch.nn.Module, prompt_ids: list[int], n: int) -> list[int]:
    ids, out = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(nxt)
            ids.append(nxt)
    return out


def perturb_towards(model: Any, prompt_ids: list[int], token: int) -> None:
    """Set ``token``'s (tied) embedding row to SCALE x the unit final hidden state of the prompt's last position."""
    captured: dict[str, torch.Tensor] = {}
    hook = model.model.norm.register_forward_hook(lambda _m, _i, out: captured.__setitem__("h", out.detach()))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([prompt_ids]))
    finally:
        hook.remove()
    h = captured["h"][0, -1]
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = h / h.norm() * SCALE


async def test_a_learner_checkpoint_reloads_into_vllm_and_the_real_model_restores_it(
    vllm_server: VllmServer, real_model_dir: Path, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=vllm_server.base_url, timeout=300) as c:
        prompt_ids = await tokens(c, messages=MESSAGES, add_generation_prompt=True)
        (target,) = await tokens(c, prompt=TARGET_WORD, add_special_tokens=False)
        base_ids, base_lps = await greedy(c, prompt_ids)
        assert target not in prompt_ids and target not in base_ids

        # The learner's own code, end to end: load (fp32, on CPU), change the weights, save, the event it publishes.
        torch.set_num_threads(2)
        learner = Learner(
            LearnerSettings(model_dir=real_model_dir, checkpoint_dir=tmp_path / "ckpt", device="cpu", kl_coef=0.0)
        )
        model: Any = unwrap(learner.model)
        model.eval()
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight, "SmolLM2 ties them"
        perturb_towards(model, prompt_ids, target)
        expected = hf_greedy(model, prompt_ids, N_TOKENS)
        assert expected == [target] * N_TOKENS
        learner.state.version = learner.state.step = 1  # what step() records for an applied batch
        saved = learner.save()
        assert saved is not None
        event = learner.weights_event()
        assert event.version == 1 and Path(event.uri) == saved.resolve()
        assert event.base_model == InferenceSettings.model_fields["policy_name"].default  # the follower's filter
        # Stored once, under the embedding's name, like the base model: vLLM must tie lm_head to it on reload.
        shapes = read_tensor_shapes(saved)
        assert shapes == read_tensor_shapes(real_model_dir) and "lm_head.weight" not in shapes
        del learner, model

        # What the --engine vllm proxy does with each WeightsPublished (vllm_proxy.create_vllm_app's lifespan).
        weights = VllmWeights(
            c, vllm_server.base_url, Admission(), model_dir=real_model_dir, version=read_version(real_model_dir) or 0
        )
        try:
            await weights.sync()
            assert await apply_weights_event(weights, event)
            assert weights.version == 1 and weights.stats["reloads"] == 1
            assert await weight_info(c) == f"floe:1:{saved.resolve()}"
            changed_ids, changed_lps = await greedy(c, prompt_ids)
            assert changed_ids == expected, (changed_ids, expected)
            # Far above anything the real model gives: the logit of " banana" is ~SCALE x |h| (a near-certain pick).
            assert min(changed_lps) > -1e-3, changed_lps

            back = WeightsPublished(version=2, uri=str(real_model_dir), step=2, base_model=event.base_model)
            assert await apply_weights_event(weights, back)
            assert weights.version == 2 and weights.stats["reloads"] == 2
            restored_ids, restored_lps = await greedy(c, prompt_ids)
        finally:
            if weights.path != real_model_dir:
                vllm_server.reload(real_model_dir)  # the session's server must serve the real model for later tests
        assert restored_ids == base_ids
        assert restored_lps == pytest.approx(base_lps, abs=1e-5)
