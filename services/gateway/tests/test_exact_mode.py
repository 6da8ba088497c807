"""Exact (token-in/token-out) mode: every turn's prompt extends the previous prompt + sampled ids, with 0
re-tokenized tokens; canonical mode reports the prefix breaks that exact mode avoids."""

from __future__ import annotations

import httpx
import openai

from contracts import TokenizationMode, decode_prompts

from ._fakes import IM_END, encode, render

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def full_prompts(records) -> list[list[int]]:
    """Undo the delta encoding with the contract's own decoder."""
    return [list(p) for p in decode_prompts(records)]


def _client(creds) -> openai.OpenAI:
    return openai.OpenAI(base_url=creds["base_urls"]["openai"], api_key=creds["token"], max_retries=0)


def test_multi_turn_tool_conversation_never_retokenizes(gw) -> None:
    creds = gw.session("ex1", TokenizationMode.EXACT)
    client = _client(creds)
    msgs: list[dict] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "CALL_TOOL go"}]
    out = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    call = out.choices[0].message.tool_calls[0]
    # the harness reformats the arguments JSON and the call id: exact mode must still match the turn
    msgs += [
        {
            "role": "assistant",
            "content": out.choices[0].message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    out2 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=False)
    msgs += [{"role": "assistant", "content": out2.choices[0].message.content}, {"role": "user", "content": "thanks"}]
    stream = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True)
    text3 = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text3 == "Hello! You said: thanks"
    recs = gw.sink.events
    assert [r.tokenization for r in recs] == [TokenizationMode.EXACT] * 3
    fulls = full_prompts(recs)
    for prev, cur, prev_full in zip(recs, recs[1:], fulls, strict=False):
        seq = prev_full + prev.completion_token_ids
        assert fulls[recs.index(cur)][: len(seq)] == seq, "prompt must start with previous prompt + sampled ids"
        assert cur.prefix_call_index == prev.call_index and cur.prefix_len == len(seq)
    assert recs[0].completion_token_ids[-1] == IM_END
    # turns sent as token ids via /v1/completions, not as messages
    sent = [body for path, body in gw.engine.requests if path == "/v1/completions"][-3:]
    assert [b["prompt"] for b in sent] == fulls
    assert not any(c.startswith("exact:new_chain") for c in recs[1].gateway_changes + recs[2].gateway_changes)


def test_exact_keeps_sampled_reasoning_that_canonical_loses(gw) -> None:
    msgs = [{"role": "user", "content": "THINK"}]
    for mode in (TokenizationMode.EXACT, TokenizationMode.CANONICAL):
        creds = gw.session(f"think-{mode.value}", mode)
        client = _client(creds)
        out = client.chat.completions.create(model="m", messages=msgs)
        # the harness drops reasoning_content on replay, as most do
        replay = [
            *msgs,
            {"role": "assistant", "content": out.choices[0].message.content},
            {"role": "user", "content": "again"},
        ]
        client.chat.completions.create(model="m", messages=replay)
    ex1, ex2, ca1, ca2 = gw.sink.events
    ex_full = full_prompts([ex1, ex2])
    assert ex_full[1][: ex1.prompt_len + len(ex1.completion_token_ids)] == ex_full[0] + ex1.completion_token_ids
    assert "<think>" in "".join(chr(t - 10) for t in ex_full[1] if t > 2)
    ca_full = full_prompts([ca1, ca2])
    assert ca2.prefix_extends_previous is False  # the canonical re-render dropped the sampled <think> block
    assert ca_full[1] == encode(
        render([*msgs, {"role": "assistant", "content": "Hi there."}, {"role": "user", "content": "again"}], None, True)
    )
    metrics = httpx.get(gw.url + "/metrics").text
    assert "floe_gateway_canonical_prefix_breaks_total 1.0" in metrics


def test_changed_history_starts_a_new_chain(gw) -> None:
    creds = gw.session("ex3", TokenizationMode.EXACT)
    client = _client(creds)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}])
    client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "something else"},
            {"role": "user", "content": "two"},
        ],
    )
    r1, r2 = gw.sink.events
    assert "exact:new_chain:reply_differs (call 0, message 1 (assistant))" in r2.gateway_changes
    # still delta-encoded against the shared prefix, and still the exact template rendering
    assert r2.prefix_call_index == 0 and 0 < r2.prefix_len <= r1.prompt_len


def test_a_rewritten_history_is_named_after_the_closest_earlier_call(gw) -> None:
    # Like Claude Code: a side call with other tools first (its quota/title probe), then the main conversation,
    # which comes back with one of its own earlier messages rewritten. The reason must point at the main
    # conversation, not at the side call that happens to be the oldest.
    creds = gw.session("ex5", TokenizationMode.EXACT)
    client = _client(creds)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a title please"}])
    first = [{"role": "user", "content": "one"}]
    out = client.chat.completions.create(model="m", messages=first, tools=TOOLS)
    client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": "one, rewritten"},
            {"role": "assistant", "content": out.choices[0].message.content},
            {"role": "user", "content": "two"},
        ],
        tools=TOOLS,
    )
    third = gw.sink.events[-1]
    assert "exact:new_chain:history_differs (call 1, message 0 (user))" in third.gateway_changes


def test_length_stop_appends_the_closing(gw) -> None:
    creds = gw.session("ex4", TokenizationMode.EXACT)
    client = _client(creds)
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "LONG"}], max_tokens=20)
    assert out.choices[0].finish_reason == "length"
    client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": "LONG"},
            {"role": "assistant", "content": out.choices[0].message.content},
            {"role": "user", "content": "go on"},
        ],
    )
    r1, r2 = gw.sink.events
    full2 = full_prompts([r1, r2])[1]
    seq1 = full_prompts([r1])[0] + r1.completion_token_ids
    assert full2[: len(seq1)] == seq1
    assert full2[len(seq1) : len(seq1) + 2] == [IM_END, encode("\n")[0]]  # the template's closing, not sampled
