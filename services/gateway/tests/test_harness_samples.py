"""The redacted requests real CLIs sent (``tests/golden/harness-samples``; docs/harnesses.md, "How this is verified")
parse with our wire models and convert to a canonical turn without loss: roles, tool calls and results, system
prompts, side-call classification. They are hints: the real CLIs run in ``test_e2e_harness_clis.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.protocols import anthropic_messages, google_generate, openai_chat, openai_responses

SAMPLES = Path(__file__).parent / "golden" / "harness-samples"


def _load(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(p.stem for p in SAMPLES.glob("*.json")))
def test_sample_converts(name: str) -> None:
    sample = _load(name)
    path, body = sample["_capture"]["path"], sample["body"]
    if path.endswith("/chat/completions"):
        canon = openai_chat.to_canonical(openai_chat.ChatRequest.model_validate(body))
    elif path.endswith("/responses"):
        canon = openai_responses.to_canonical(openai_responses.ResponsesRequest.model_validate(body))
    elif path.endswith("/messages"):
        canon = anthropic_messages.to_canonical(anthropic_messages.MessagesRequest.model_validate(body))
    else:
        model = path.rsplit("/", 1)[1].split(":")[0]
        canon = google_generate.to_canonical(google_generate.GenerateRequest.model_validate(body), model, stream=True)
    assert canon.messages and canon.messages[-1].role in ("user", "tool")
    # every tool result answers a tool call made earlier in the conversation
    call_ids = {c.id for m in canon.messages for c in m.tool_calls}
    for m in canon.messages:
        if m.role == "tool":
            assert m.tool_call_id in call_ids, (name, m.tool_call_id)


def test_claude_code_details() -> None:
    canon = anthropic_messages.to_canonical(
        anthropic_messages.MessagesRequest.model_validate(_load("claude-code")["body"])
    )
    roles = [m.role for m in canon.messages]
    assert roles[:3] == ["system", "user", "system"]  # the in-messages system message stays in place
    assert canon.messages[0].content.startswith("x-anthropic-billing-header")  # removed later by the pipeline
    assert canon.thinking is True and canon.tools and canon.messages[-1].role == "tool"
    title = anthropic_messages.to_canonical(
        anthropic_messages.MessagesRequest.model_validate(_load("claude-code-title")["body"])
    )
    assert title.side_call == "title"


def test_codex_details() -> None:
    body = _load("codex")["body"]
    canon = openai_responses.to_canonical(openai_responses.ResponsesRequest.model_validate(body))
    assert [m.role for m in canon.messages][:2] == ["system", "system"]  # developer messages
    assert {t.name for t in canon.tools} >= {"exec_command"}
    assert all(t.name for t in canon.tools)  # namespace / web_search dropped, not turned into nameless tools


def test_gemini_router_is_classified() -> None:
    sample = _load("gemini-cli-router")
    model = sample["_capture"]["path"].rsplit("/", 1)[1].split(":")[0]
    canon = google_generate.to_canonical(
        google_generate.GenerateRequest.model_validate(sample["body"]), model, stream=False
    )
    assert canon.side_call == "router"
