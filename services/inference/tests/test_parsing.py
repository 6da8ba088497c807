"""Token-level output parsing: reasoning, Hermes tool calls, malformed calls, stop strings, UTF-8 holdback."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.checkpoint import load_tokenizer
from inference.parsing import ChatOutputParser, TextStreamer
from inference.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(dev_model_dir: Path) -> Tokenizer:
    return load_tokenizer(dev_model_dir)


def feed(parser: ChatOutputParser, ids: list[int]) -> list[tuple[str, str, int]]:
    deltas = [parser.push(i) for i in ids] + [parser.finish()]
    return [(d.content, d.reasoning, len(d.tool_calls)) for d in deltas if d]


def test_reasoning_and_tool_call_are_separated(tok: Tokenizer) -> None:
    text = '<think>\nlook first\n</think>\n\nOK.<tool_call>\n{"name": "ls", "arguments": {"dir": "src"}}\n</tool_call>'
    parser = ChatOutputParser(tok)
    feed(parser, tok.encode(text))
    assert parser.reasoning == "\nlook first\n"
    assert parser.content == "\n\nOK."
    assert [(c.name, c.arguments) for c in parser.tool_calls] == [("ls", '{"dir": "src"}')]
    assert parser.tool_calls[0].id.startswith("chatcmpl-tool-")


def test_streamed_deltas_concatenate_to_the_full_result(tok: Tokenizer) -> None:
    text = '<think>é🚀</think>héllo <tool_call>{"name": "a", "arguments": "{}"}</tool_call> tail'
    parser = ChatOutputParser(tok)
    deltas = feed(parser, tok.encode(text))
    assert "".join(c for c, _, _ in deltas) == parser.content == "héllo  tail"
    assert "".join(r for _, r, _ in deltas) == parser.reasoning == "é🚀"
    assert sum(n for _, _, n in deltas) == 1
    assert parser.tool_calls[0].arguments == "{}"


def test_malformed_or_unclosed_tool_call_is_kept_as_content(tok: Tokenizer) -> None:
    parser = ChatOutputParser(tok)
    feed(parser, tok.encode("x<tool_call>not json</tool_call>y"))
    assert parser.tool_calls == []
    assert parser.content == "x<tool_call>not json</tool_call>y"
    cut = ChatOutputParser(tok)
    feed(cut, tok.encode('a<tool_call>{"name": "f"'))
    assert cut.content == 'a<tool_call>{"name": "f"'


def test_tools_not_parsed_when_disabled(tok: Tokenizer) -> None:
    parser = ChatOutputParser(tok, parse_tools=False)
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    feed(parser, tok.encode(text))
    assert parser.tool_calls == [] and parser.content == text


def test_text_streamer_never_emits_part_of_a_stop_string(tok: Tokenizer) -> None:
    streamer = TextStreamer(tok, stop=("STOP!",))
    out = "".join(streamer.push(i) for i in tok.encode("abc STOP! more"))
    assert "STOP" not in out
    out += streamer.finish()
    assert out == "abc "


def test_text_streamer_holds_incomplete_utf8(tok: Tokenizer) -> None:
    streamer = TextStreamer(tok)
    pieces = [streamer.push(i) for i in tok.encode("🚀🚀")]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + streamer.finish() == "🚀🚀"
