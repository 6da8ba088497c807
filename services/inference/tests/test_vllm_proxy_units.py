"""The pieces of the vLLM proxy that need neither vLLM nor a broker: stamping vLLM's bytes, the checkpoint checks,
the admission gate. The bytes below are vLLM 0.32's own (captured from the CPU build serving SmolLM2)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from inference.reloader import WeightsLostError
from inference.vllm_proxy import stamp_events, stamp_json
from inference.vllm_weights import (
    Admission,
    IncompatibleCheckpointError,
    check_compatible,
    read_architecture,
    read_tensor_shapes,
)

HEAD = b'data: {"id":"chatcmpl-83","object":"chat.completion.chunk","created":1796160253,"model":"policy",'
FIRST = HEAD + (
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":[1,9690,198],"prompt_text":null}\n\n'
)
# Content that spells the final-chunk pattern: escaped inside a JSON string, it must not count.
TOKEN = HEAD + (
    b'"choices":[{"index":0,"delta":{"content":"\\"finish_reason\\": \\"stop\\""},"logprobs":{"content":[{"token":'
    b'"2","logprob":-1.767,"bytes":[50],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[34]}]}\n\n'
)
FINAL = HEAD + (
    b'"choices":[{"index":0,"delta":{"content":"3"},"logprobs":null,"finish_reason":"length","stop_reason":null,'
    b'"token_ids":[35]}]}\n\n'
)
USAGE = HEAD + b'"choices":[],"usage":{"prompt_tokens":37,"total_tokens":41,"completion_tokens":4}}\n\n'
DONE = b"data: [DONE]\n\n"


def events(raw: bytes) -> list[dict[str, object]]:
    return [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]


def test_only_the_final_and_usage_chunks_are_stamped_and_nothing_else_changes() -> None:
    for chunk in (FIRST, TOKEN, DONE):
        assert stamp_events(chunk, 7) is chunk  # untouched: not even copied
    block = FIRST + TOKEN + FINAL + USAGE + DONE  # several events in one read
    stamped = events(stamp_events(block, 7))
    original = events(block)
    assert [e.get("weight_version") for e in stamped] == [None, None, 7, 7]
    assert [{k: v for k, v in e.items() if k != "weight_version"} for e in stamped] == original
    assert stamp_events(block, 7).endswith(DONE)


def test_json_answers_get_the_field_first() -> None:
    body = b'{"id":"chatcmpl-1","choices":[{"index":0}],"usage":{"prompt_tokens":3}}'
    stamped = stamp_json(body, 12)
    assert stamped.startswith(b'{"weight_version":12,"id"')
    assert json.loads(stamped) == {**json.loads(body), "weight_version": 12}
    assert json.loads(stamp_json(b"{}", 3)) == {"weight_version": 3}
    assert json.loads(stamp_json(b'{"tokens":[1,2],"count":2}', 0))["weight_version"] == 0


def write_checkpoint(
    path: Path, *, layers: int = 2, hidden: int = 8, shapes: dict[str, tuple[int, ...]] | None = None
) -> Path:
    path.mkdir(parents=True)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden}
    config |= {"num_hidden_layers": layers, "vocab_size": 32, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(config))
    tensors = shapes or {"model.embed_tokens.weight": (32, hidden), "model.norm.weight": (hidden,)}
    save_file({k: torch.zeros(s) for k, s in tensors.items()}, str(path / "model.safetensors"))
    return path


def check(path: Path, served: Path) -> None:
    check_compatible(path, served, read_architecture(served), read_tensor_shapes(served))


def test_a_checkpoint_of_another_architecture_is_refused_naming_both(tmp_path: Path) -> None:
    served = write_checkpoint(tmp_path / "served")
    check(write_checkpoint(tmp_path / "same"), served)  # same architecture, other values: fine
    with pytest.raises(IncompatibleCheckpointError) as err:
        check(write_checkpoint(tmp_path / "deeper", layers=3), served)
    message = str(err.value)
    assert str(tmp_path / "deeper") in message and str(served) in message
    assert "num_hidden_layers=3" in message and "num_hidden_layers=2" in message
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        check(tmp_path / "nowhere", served)


def test_tensor_names_and_shapes_must_match_too(tmp_path: Path) -> None:
    served = write_checkpoint(tmp_path / "served")
    # vLLM 0.32 kills its engine on a wrong shape, and silently keeps the old values of a missing tensor.
    with pytest.raises(IncompatibleCheckpointError, match=r"model.norm.weight is \[9\], served \[8\]"):
        check(
            write_checkpoint(
                tmp_path / "shape", shapes={"model.embed_tokens.weight": (32, 8), "model.norm.weight": (9,)}
            ),
            served,
        )
    with pytest.raises(IncompatibleCheckpointError, match=r"1 missing.*model.norm.weight"):
        check(write_checkpoint(tmp_path / "missing", shapes={"model.embed_tokens.weight": (32, 8)}), served)


def test_a_truncated_safetensors_file_is_refused(tmp_path: Path) -> None:
    served = write_checkpoint(tmp_path / "served")
    partial = tmp_path / "partial"
    shutil.copytree(served, partial)
    data = (partial / "model.safetensors").read_bytes()
    (partial / "model.safetensors").write_bytes(data[:-16])  # a checkpoint still being written
    with pytest.raises(IncompatibleCheckpointError, match="truncated"):
        check(partial, served)
    (partial / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(IncompatibleCheckpointError, match="not a readable safetensors file"):
        check(partial, served)


async def test_the_gate_drains_requests_inside_and_holds_new_ones() -> None:
    gate = Admission()
    await gate.enter()  # a request in flight
    order: list[str] = []

    async def reload() -> None:
        async with gate.closed(drain_timeout_s=5):
            order.append("reload")

    async def late_request() -> None:
        await gate.enter()
        order.append("late request")
        gate.leave()

    reloading = asyncio.create_task(reload())
    await asyncio.sleep(0.05)
    assert not gate.is_open and order == []  # waits for the request inside
    late = asyncio.create_task(late_request())
    await asyncio.sleep(0.05)
    assert order == []  # the new request waits at the closed gate
    gate.leave()
    await asyncio.gather(reloading, late)
    assert order == ["reload", "late request"] and gate.is_open


async def test_a_drain_that_times_out_reopens_the_gate_and_a_lost_gate_refuses() -> None:
    gate = Admission()
    await gate.enter()
    with pytest.raises(TimeoutError):
        async with gate.closed(drain_timeout_s=0.05):
            pass
    assert gate.is_open and gate.inside == 1
    gate.failure = "weights unknown"
    with pytest.raises(WeightsLostError, match="weights unknown"):
        await gate.enter()
