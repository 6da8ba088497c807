"""Exact (token-in/token-out) prompt construction.

When a request extends a previous call of its session — its messages are that call's request messages, then an
assistant message equal to the answer the client received (same text and tool calls, ids and JSON formatting
ignored), then a non-empty tail — the prompt is built without re-tokenizing anything the model saw or sampled::

    prompt = prev.prompt_ids + prev.completion_ids + closing + tail_ids

- ``prev.completion_ids`` are the *sampled* ids, including the end-of-turn token when the model emitted it.
- ``closing`` is what the chat template puts after an assistant message's content (e.g. ``<|im_end|>`` ``\\n``),
  minus the part the model already sampled: the longest prefix of it the completion ends with is skipped. After a
  ``length`` stop the whole closing is appended (those tokens are prompt, never trained on).
- ``tail_ids`` are the new messages rendered in a fixed context: ``render(D + tail, gen_prompt) - render(D)``
  where ``D`` = [user "floe", assistant "floe"] and the same tools, so template headers that depend on earlier
  turns (tool-response grouping, system/tool preamble) stay right. ``render(D)`` must be a prefix of the longer
  rendering; otherwise the template is not append-only for this tail and we fall back.

Fallback (no earlier call matches, tools changed, or a template check fails): tokenize the whole conversation with
the chat template, still sent as token ids; the call starts a new chain and the reason is in ``gateway_changes``.
``closing``/``D`` renderings are cached per tool set. Limits: templates that rewrite *earlier* turns depending on
later ones (e.g. Qwen3 dropping past ``<think>``) are exactly what this avoids, but such a template will not match
a later canonical re-render: that divergence is intended, the trainer sees the sampled context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.canonical import CanonicalRequest
from gateway.registry import ChainEntry, Session
from gateway.upstream import EngineClient

__all__ = ["ExactPlan", "ExactPlanner", "tools_key"]

_DUMMY = [{"role": "user", "content": "floe"}, {"role": "assistant", "content": "floe"}]


def tools_key(req: CanonicalRequest) -> str:
    return json.dumps([t.to_engine() for t in req.tools], sort_keys=True)


@dataclass(frozen=True)
class ExactPlan:
    prompt_ids: list[int]
    max_model_len: int | None
    extends: ChainEntry | None
    note: str  # "extends", or why a new chain started (a small fixed set: also a metric label)
    detail: str = ""  # where the closest earlier call diverges (free text, for gateway_changes)


@dataclass(frozen=True)
class _Frame:
    base_ids: list[int]  # render(D)
    closing: list[int]  # template tokens after an assistant message's content


class ExactPlanner:
    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine
        self._frames: dict[str, _Frame | None] = {}
        self.max_model_len: int | None = None

    @staticmethod
    def find_parent(session: Session, req: CanonicalRequest, tkey: str) -> tuple[ChainEntry | None, str, str]:
        """The earlier call this request extends, or None with why not: ``(parent, reason, detail)``.

        Without a parent, the reason is the one of the *closest* earlier call (same tools, longest matching history),
        not of whichever call was looked at last, and ``detail`` says where that call and this request part ways
        (e.g. a harness that rewrites its own earlier tool calls: ``history_differs``, ``call 3, message 4
        (assistant)``)."""
        keys = [m.semantic_key() for m in req.messages]
        best: tuple[int, int, str, str] = (0, -1, "no_previous_call", "")  # (rank, matched messages, reason, detail)
        for entry in reversed(session.chain):
            n = len(entry.messages)
            if entry.tools_key != tkey:
                cand = (1, -1, "tools_changed", f"call {entry.call_index}")
            elif len(keys) <= n + 1:
                cand = (2, -1, "not_longer", f"call {entry.call_index}: {n + 1} messages, this request {len(keys)}")
            else:
                prev = [m.semantic_key() for m in entry.messages]
                if prev != keys[:n]:
                    at = next(i for i, (a, b) in enumerate(zip(prev, keys, strict=False)) if a != b)
                    role = getattr(req.messages[at], "role", "?")
                    cand = (3, at, "history_differs", f"call {entry.call_index}, message {at} ({role})")
                elif entry.reply.semantic_key() != keys[n]:
                    cand = (4, n, "reply_differs", f"call {entry.call_index}, message {n} (assistant)")
                else:
                    return entry, "extends", ""
            if cand[:2] > best[:2]:
                best = cand
        return None, best[2], best[3]

    async def _frame(
        self, session_id: str, tools: list[dict[str, Any]], tkey: str, kw: dict[str, Any] | None
    ) -> _Frame | None:
        cache_key = tkey + json.dumps(kw, sort_keys=True)
        if cache_key in self._frames:
            return self._frames[cache_key]
        tok = self._engine.tokenize_chat
        base = await tok(session_id, _DUMMY, tools, add_generation_prompt=False, chat_template_kwargs=kw)
        # The closing is the common suffix of two renderings that differ only in the assistant content.
        a = await tok(
            session_id,
            [_DUMMY[0], {"role": "assistant", "content": "A"}],
            tools,
            add_generation_prompt=False,
            chat_template_kwargs=kw,
        )
        b = await tok(
            session_id,
            [_DUMMY[0], {"role": "assistant", "content": "B"}],
            tools,
            add_generation_prompt=False,
            chat_template_kwargs=kw,
        )
        k = 0
        while k < min(len(a.tokens), len(b.tokens)) and a.tokens[-1 - k] == b.tokens[-1 - k]:
            k += 1
        frame = _Frame(base_ids=base.tokens, closing=a.tokens[len(a.tokens) - k :]) if 0 < k < len(a.tokens) else None
        self.max_model_len = base.max_model_len or self.max_model_len
        self._frames[cache_key] = frame
        return frame

    async def plan(
        self,
        session: Session,
        req: CanonicalRequest,
        engine_messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        kw: dict[str, Any] | None,
        tkey: str,
    ) -> ExactPlan:
        """``tkey``: ``tools_key(req)``, which the caller keeps for the call's chain entry (computed once a call: on
        an agent's tool schemas, tens of KB, the sorted dump is not free)."""
        parent, reason, detail = self.find_parent(session, req, tkey)
        if parent is not None:
            frame = await self._frame(session.session_id, tools, tkey, kw)
            if frame is None:
                reason, detail = "template_not_append_only", ""
            else:
                tail = engine_messages[len(parent.messages) + 1 :]
                rendered = await self._engine.tokenize_chat(
                    session.session_id, _DUMMY + tail, tools, add_generation_prompt=True, chat_template_kwargs=kw
                )
                if rendered.tokens[: len(frame.base_ids)] == frame.base_ids:
                    tail_ids = rendered.tokens[len(frame.base_ids) :]
                    done = _sampled_closing(parent.completion_ids, frame.closing)
                    prompt = parent.prompt_ids + parent.completion_ids + frame.closing[done:] + tail_ids
                    return ExactPlan(prompt, rendered.max_model_len or self.max_model_len, parent, "extends")
                reason, detail = "tail_not_append_only", ""
        full = await self._engine.tokenize_chat(
            session.session_id, engine_messages, tools, add_generation_prompt=True, chat_template_kwargs=kw
        )
        return ExactPlan(full.tokens, full.max_model_len, None, reason, detail)


def _sampled_closing(completion: list[int], closing: list[int]) -> int:
    """How many leading tokens of ``closing`` the completion already ends with."""
    for k in range(min(len(closing), len(completion)), 0, -1):
        if completion[-k:] == closing[:k]:
            return k
    return 0
