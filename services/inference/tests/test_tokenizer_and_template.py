"""The dev tokenizer is deterministic, lossless, and the chat template renders ChatML + Hermes tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from inference.checkpoint import load_tokenizer
from inference.tokenizer_build import CONTROL_TOKENS, MARKER_TOKENS, build_tokenizer


def test_tokenizer_build_is_deterministic(tmp_path: Path) -> None:
    build_tokenizer(tmp_path / "a")
    build_tokenizer(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_checkpoint_dir_loads_with_auto_classes(dev_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(dev_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(dev_model_dir))
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)


def test_special_and_marker_tokens_are_single_ids(dev_model_dir: Path) -> None:
    tok = load_tokenizer(dev_model_dir)
    for t in (*CONTROL_TOKENS, *MARKER_TOKENS):
        ids = tok.encode(t)
        assert len(ids) == 1, t
        assert tok.token_strs(ids) == [t]
    # ChatML frame tokens are skipped in output text; the tags stay visible.
    ids = tok.encode("<|im_start|>a<think>b</think><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "a<think>b</think>"


def test_byte_level_round_trip_of_arbitrary_text(dev_model_dir: Path) -> None:
    tok = load_tokenizer(dev_model_dir)
    for text in ("héllo wörld 🚀 — ∑", "def f(x):\n\treturn x  # ok\n", "中文 text \x00 \u200b", " leading space"):
        assert tok.decode(tok.encode(text)) == text


def test_chat_template_renders_tools_calls_and_results(dev_model_dir: Path) -> None:
    tok = load_tokenizer(dev_model_dir)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    messages: list[Any] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "open a.txt"}]},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "need the file",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "hello"},
        {"role": "tool", "tool_call_id": "c2", "content": "again"},
    ]
    text = tok.render_chat(messages, tools, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nbe brief\n\n# Tools")
    assert json.dumps(tools[0]) in text
    assert (
        "<think>\nneed the file\n</think>\n\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>' in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\nhello\n</tool_response>\n<tool_response>\nagain\n</tool_response><|im_end|>"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")
    plain = tok.render_chat([{"role": "user", "content": "hi"}], None, add_generation_prompt=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"
