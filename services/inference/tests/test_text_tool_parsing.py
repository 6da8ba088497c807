"""Hermes tool calls written as plain text (SmolLM2: no ``<tool_call>`` token), and floe's SmolLM2 chat template.

The tokenizer here is a small byte-level BPE trained in the test with only the ChatML control tokens, so the tags are
several ordinary tokens, as they are for SmolLM2; the real SmolLM2 tokenizer is exercised by the ``vllm`` tests.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from inference.chat_template import SMOLLM2_CHAT_TEMPLATE, SMOLLM2_DEFAULT_SYSTEM
from inference.parsing import ChatOutputParser
from inference.tokenizer import Tokenizer

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [f"The tool call {i} adds numbers: {CALL} and then it answers {i + 1}." for i in range(50)]
    raw.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", unk_token="<|endoftext|>")  # type: ignore[no-untyped-call]
    t = Tokenizer(hf)
    assert t.token_id("<tool_call>") is None and len(t.encode("<tool_call>")) > 1, "tags must not be single tokens"
    return t


def run(parser: ChatOutputParser, ids: list[int]) -> tuple[str, int]:
    """Feed ids one by one; return the streamed content and the number of streamed tool calls."""
    deltas = [parser.push(i) for i in ids] + [parser.finish()]
    return "".join(d.content for d in deltas), sum(len(d.tool_calls) for d in deltas)


def test_text_tool_call_is_parsed_once_with_content_around_it(tok: Tokenizer) -> None:
    parser = ChatOutputParser(tok)
    streamed, n_calls = run(parser, tok.encode(f"Let me add. {CALL} Done."))
    assert [(c.name, json.loads(c.arguments)) for c in parser.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert n_calls == 1 and parser.tool_calls[0].id.startswith("chatcmpl-tool-")
    assert streamed == parser.content == "Let me add.  Done."


def test_partial_tag_is_held_back_until_it_is_known(tok: Tokenizer) -> None:
    parser = ChatOutputParser(tok)
    for i in tok.encode("ok <tool_ca"):
        assert "<" not in parser.push(i).content  # might become a call: not content yet
    assert parser.finish().content == "<tool_ca"  # generation ended: it was text after all
    assert parser.content == "ok <tool_ca"


def test_malformed_and_unclosed_blocks_stay_content(tok: Tokenizer) -> None:
    bad = ChatOutputParser(tok)
    assert run(bad, tok.encode("x<tool_call>not json</tool_call>y")) == ("x<tool_call>not json</tool_call>y", 0)
    cut = ChatOutputParser(tok)
    assert run(cut, tok.encode('a<tool_call>{"name": "f"')) == ('a<tool_call>{"name": "f"', 0)


def test_two_calls_and_stop_strings(tok: Tokenizer) -> None:
    parser = ChatOutputParser(tok, stop=("STOP",))
    streamed, n_calls = run(parser, tok.encode(f"{CALL}{CALL} tail STOP never"))
    assert n_calls == 2 and len({c.id for c in parser.tool_calls}) == 2
    assert streamed == parser.content == " tail "


def test_text_tools_not_parsed_when_disabled(tok: Tokenizer) -> None:
    parser = ChatOutputParser(tok, parse_tools=False)
    assert run(parser, tok.encode(CALL)) == (CALL, 0)


def test_smollm2_template_keeps_the_default_system_prompt_and_adds_tools(tok: Tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

    def render(messages: list[dict[str, str]], with_tools: bool = False) -> str:
        text = tok.hf.apply_chat_template(
            messages,
            tools=tools if with_tools else None,
            chat_template=SMOLLM2_CHAT_TEMPLATE,
            tokenize=False,
            add_generation_prompt=True,
        )
        return str(text)

    user = {"role": "user", "content": "hi"}
    # SmolLM2's own behaviour: no system message -> its default one.
    assert render([user]) == (
        f"<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render([{"role": "system", "content": "be brief"}, user]).startswith(
        "<|im_start|>system\nbe brief<|im_end|>"
    )
    with_tools = render([user], with_tools=True)
    assert with_tools.startswith(f"<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}\n\n# Tools\n")
    assert json.dumps(tools[0]) in with_tools and "<tool_call></tool_call> XML tags" in with_tools
    assert SMOLLM2_DEFAULT_SYSTEM not in render([{"role": "system", "content": "s"}, user], with_tools=True)
