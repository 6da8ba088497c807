"""Request handling for the OpenAI-compatible endpoints: prompt building, engine calls, vLLM-shaped responses.

Role: ``OpenAIServing`` turns validated requests into engine submissions and engine events into response dicts
(non-streaming) or SSE lines (streaming). Client mistakes raise ``APIError`` (4xx); nothing here formats HTTP.

Token faithfulness: ``prompt_token_ids`` are exactly the ids the engine consumed and ``token_ids`` exactly the ids it
sampled (including the final EOS token, as vLLM returns it); text is *derived* from ids, never re-tokenized.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog
from jinja2 import TemplateError

from inference.engine import ContextLengthError, Engine, Finish, GenerationHandle, TokenEvent
from inference.errors import APIError, bad_request, context_length_exceeded, model_not_found
from inference.parsing import ChatOutputParser, Delta, TextStreamer, truncate_at_stop
from inference.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    new_id,
    now_s,
)
from inference.sampling import SamplingParams
from inference.settings import InferenceSettings

__all__ = ["OpenAIServing", "Stream"]

log = structlog.get_logger()

JSON = dict[str, Any]


@dataclass
class Stream:
    """A started stream: the weight version is known (first event arrived), ``lines`` yields SSE text."""

    version: int
    lines: AsyncIterator[str]


def _sse(obj: JSON) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIServing:
    def __init__(self, engine: Engine, settings: InferenceSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.tokenizer = engine.tokenizer

    # --- shared helpers ----------------------------------------------------------------------------------------

    def _check_model(self, name: str | None) -> str:
        if name is None or name == self.settings.served_model_name or self.settings.accept_any_model:
            return name or self.settings.served_model_name
        raise model_not_found(name)

    def _token_str(self, token_id: int, as_ids: bool) -> str:
        if as_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def _sampling(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        prompt_len: int,
        max_tokens: int | None,
        logprobs: int | None,
    ) -> SamplingParams:
        if req.n != 1:
            raise bad_request("n > 1 is not supported by the floe CPU engine; send n separate requests", param="n")
        if logprobs is not None and logprobs > self.settings.max_logprobs:
            raise bad_request(
                f"requested {logprobs} logprobs; at most {self.settings.max_logprobs} are allowed",
                param="top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs",
            )
        if max_tokens is None:
            max_tokens = max(1, min(self.settings.default_max_tokens, self.engine.max_model_len - prompt_len))
        try:
            max_tokens = self.engine.check_length(prompt_len, max_tokens)
        except ContextLengthError as exc:
            raise context_length_exceeded(str(exc)) from exc
        vocab = len(self.tokenizer)
        stop_ids = tuple(req.stop_token_ids or ())
        if any(t < 0 or t >= vocab for t in stop_ids):
            raise bad_request(f"stop_token_ids must be in [0, {vocab})", param="stop_token_ids")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0,
            seed=req.seed,
            stop=tuple(req.stop_list()),
            stop_token_ids=stop_ids,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
        )

    def _submit(self, prompt_ids: list[int], params: SamplingParams) -> GenerationHandle:
        try:
            return self.engine.submit(prompt_ids, params)
        except ContextLengthError as exc:
            raise context_length_exceeded(str(exc)) from exc
        except ValueError as exc:
            raise bad_request(str(exc), param="prompt") from exc

    def _usage(self, prompt_len: int, completion_len: int) -> JSON:
        return {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion_len,
            "total_tokens": prompt_len + completion_len,
            "prompt_tokens_details": None,
        }

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[JSON] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        kwargs: dict[str, Any] | None,
    ) -> list[int]:
        if add_generation_prompt and continue_final_message:
            raise bad_request("add_generation_prompt and continue_final_message cannot both be true")
        try:
            text = self.tokenizer.render_chat(
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **(kwargs or {}),
            )
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise bad_request(f"could not apply the chat template to these messages: {exc}", param="messages") from exc
        return self.tokenizer.encode(text)

    # --- chat --------------------------------------------------------------------------------------------------

    def _chat_logprob_entry(self, ev: TokenEvent, as_ids: bool, top_n: int) -> JSON:
        tok = self._token_str(ev.token_id, as_ids)
        return {
            "token": tok,
            "logprob": ev.logprob,
            "bytes": list(tok.encode("utf-8", errors="replace")),
            "top_logprobs": [
                {"token": (t := self._token_str(i, as_ids)), "logprob": lp, "bytes": list(t.encode("utf-8", "replace"))}
                for i, lp in ev.top_logprobs[:top_n]
            ],
        }

    async def chat(self, req: ChatCompletionRequest) -> JSON | Stream:
        model = self._check_model(req.model)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        prompt_ids = self.render_chat(
            req.messages,
            tools,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            kwargs=req.chat_template_kwargs,
        )
        top_n = req.top_logprobs or 0
        params = self._sampling(
            req, len(prompt_ids), req.max_completion_tokens or req.max_tokens, top_n if req.logprobs else None
        )
        parse_tools = bool(tools) and req.tool_choice != "none"
        handle = self._submit(prompt_ids, params)
        parser = ChatOutputParser(self.tokenizer, stop=params.stop, parse_tools=parse_tools)
        as_ids = bool(req.return_tokens_as_token_ids)
        if req.stream:
            return await self._chat_stream(req, model, handle, parser, top_n, as_ids)
        token_ids: list[int] = []
        entries: list[JSON] = []
        finish: Finish | None = None
        try:
            async for ev in handle:
                if isinstance(ev, Finish):
                    finish = ev
                    break
                token_ids.append(ev.token_id)
                parser.push(ev.token_id)
                if req.logprobs:
                    entries.append(self._chat_logprob_entry(ev, as_ids, top_n))
        finally:
            handle.cancel()  # no-op when finished; stops generation if the client went away
        assert finish is not None
        parser.finish()
        reasoning = parser.reasoning if req.include_reasoning else None
        tool_calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parser.tool_calls
        ]
        reason = "tool_calls" if tool_calls and finish.reason == "stop" else finish.reason
        return {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": now_s(),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": parser.content if (parser.content or not tool_calls) else None,
                        "refusal": None,
                        "tool_calls": tool_calls,
                        "reasoning_content": reasoning or None,
                        "reasoning": reasoning or None,
                    },
                    "logprobs": {"content": entries} if req.logprobs else None,
                    "finish_reason": reason,
                    "stop_reason": finish.stop_reason,
                    "token_ids": token_ids if req.return_token_ids else None,
                }
            ],
            "usage": self._usage(len(prompt_ids), len(token_ids)),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if req.return_token_ids else None,
            "system_fingerprint": f"floe-w{finish.version}",
            "weight_version": finish.version,
        }

    async def _first(self, handle: GenerationHandle) -> tuple[AsyncIterator[TokenEvent | Finish], TokenEvent | Finish]:
        events = aiter(handle)
        first = await anext(events)
        return events, first

    async def _chat_stream(
        self,
        req: ChatCompletionRequest,
        model: str,
        handle: GenerationHandle,
        parser: ChatOutputParser,
        top_n: int,
        as_ids: bool,
    ) -> Stream:
        events, first = await self._first(handle)
        version = first.version
        chunk_id, created = new_id("chatcmpl"), now_s()
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        want_tokens = bool(req.return_token_ids or req.logprobs)
        prompt_len = len(handle.prompt_ids)

        def chunk(delta: JSON, **extra: Any) -> JSON:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "stop_reason": None}
            choice.update(
                {k: v for k, v in extra.items() if k in ("logprobs", "finish_reason", "stop_reason", "token_ids")}
            )
            body: JSON = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }
            body.update({k: v for k, v in extra.items() if k in ("prompt_token_ids", "weight_version", "usage")})
            return body

        def delta_json(d: Delta, tool_index: int) -> JSON:
            out: JSON = {}
            if d.content:
                out["content"] = d.content
            if d.reasoning and req.include_reasoning:
                out["reasoning_content"] = d.reasoning
                out["reasoning"] = d.reasoning
            if d.tool_calls:
                out["tool_calls"] = [
                    {
                        "index": tool_index + k,
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for k, c in enumerate(d.tool_calls)
                ]
            return out

        interval = req.stream_interval or 1

        async def lines() -> AsyncIterator[str]:
            n_tokens, tools_seen = 0, 0
            batch: list[TokenEvent] = []  # tokens sampled but not yet sent, and their parsed delta
            pending = Delta()

            def flush() -> str | None:
                """The chunk of the batched tokens (None when it would say nothing); the batch is emptied."""
                nonlocal tools_seen, pending
                dj = delta_json(pending, tools_seen)
                tools_seen += len(pending.tool_calls)
                out = None
                if dj or want_tokens:
                    extra: JSON = {}
                    if req.logprobs:
                        extra["logprobs"] = {"content": [self._chat_logprob_entry(e, as_ids, top_n) for e in batch]}
                    if req.return_token_ids:
                        extra["token_ids"] = [e.token_id for e in batch]
                    out = _sse(chunk(dj, **extra))
                batch.clear()
                pending = Delta()
                return out

            try:
                head: JSON = {"role": "assistant", "content": ""}
                yield _sse(chunk(head, prompt_token_ids=handle.prompt_ids if req.return_token_ids else None))
                ev: TokenEvent | Finish | None = first
                while ev is not None:
                    if isinstance(ev, Finish):
                        if batch and (out := flush()) is not None:
                            yield out
                        tail = parser.finish()
                        if tail:
                            yield _sse(chunk(delta_json(tail, tools_seen)))
                            tools_seen += len(tail.tool_calls)
                        reason = "tool_calls" if parser.tool_calls and ev.reason == "stop" else ev.reason
                        usage = self._usage(prompt_len, n_tokens)
                        yield _sse(
                            chunk(
                                {},
                                finish_reason=reason,
                                stop_reason=ev.stop_reason,
                                weight_version=ev.version,
                                usage=None,
                            )
                        )
                        if include_usage:
                            yield _sse(
                                {
                                    "id": chunk_id,
                                    "object": "chat.completion.chunk",
                                    "created": created,
                                    "model": model,
                                    "choices": [],
                                    "usage": usage,
                                    "weight_version": ev.version,
                                }
                            )
                        break
                    n_tokens += 1
                    d = parser.push(ev.token_id)
                    pending.content += d.content
                    pending.reasoning += d.reasoning
                    pending.tool_calls += d.tool_calls
                    batch.append(ev)
                    if (n_tokens == 1 or len(batch) >= interval) and (out := flush()) is not None:
                        yield out
                    ev = await anext(events, None)
                yield "data: [DONE]\n\n"
            finally:
                handle.cancel()

        return Stream(version=version, lines=lines())

    # --- completions (token-in, token-out) --------------------------------------------------------------------

    def _completion_prompt(self, req: CompletionRequest) -> list[int]:
        p = req.prompt
        if isinstance(p, str):
            return list(self.tokenizer.encode(p, add_special_tokens=req.add_special_tokens))
        if not p:
            raise bad_request("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [int(x) for x in p]  # type: ignore[arg-type]
        if len(p) != 1:
            raise bad_request("batched prompts are not supported; send one prompt per request", param="prompt")
        only = p[0]
        if isinstance(only, str):
            return self.tokenizer.encode(only, add_special_tokens=req.add_special_tokens)
        if isinstance(only, list):
            return [int(x) for x in only]
        raise bad_request("prompt must be text, a list of token ids, or a one-element list of either", param="prompt")

    async def completions(self, req: CompletionRequest) -> JSON | Stream:
        model = self._check_model(req.model)
        if req.echo:
            raise bad_request("echo is not supported", param="echo")
        prompt_ids = self._completion_prompt(req)
        params = self._sampling(req, len(prompt_ids), req.max_tokens, req.logprobs)
        handle = self._submit(prompt_ids, params)
        as_ids = bool(req.return_tokens_as_token_ids)
        if req.stream:
            return await self._completion_stream(req, model, handle, as_ids)
        streamer = TextStreamer(self.tokenizer, params.stop)
        ids: list[int] = []
        events: list[TokenEvent] = []
        finish: Finish | None = None
        try:
            async for ev in handle:
                if isinstance(ev, Finish):
                    finish = ev
                    break
                ids.append(ev.token_id)
                events.append(ev)
                streamer.push(ev.token_id)
        finally:
            handle.cancel()
        assert finish is not None
        streamer.finish()
        text = truncate_at_stop(streamer.text(), params.stop) if params.stop else streamer.text()
        return {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": now_s(),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": self._completion_logprobs(events, req.logprobs, as_ids)
                    if req.logprobs is not None
                    else None,
                    "finish_reason": finish.reason,
                    "stop_reason": finish.stop_reason,
                    "prompt_logprobs": None,
                    "prompt_token_ids": prompt_ids if req.return_token_ids else None,
                    "token_ids": ids if req.return_token_ids else None,
                }
            ],
            "usage": self._usage(len(prompt_ids), len(ids)),
            "system_fingerprint": f"floe-w{finish.version}",
            "weight_version": finish.version,
        }

    def _completion_logprobs(self, events: list[TokenEvent], k: int | None, as_ids: bool, offset: int = 0) -> JSON:
        tokens, lps, tops, offsets = [], [], [], []
        pos = offset
        for ev in events:
            tok = self._token_str(ev.token_id, as_ids)
            tokens.append(tok)
            lps.append(ev.logprob)
            top = {self._token_str(i, as_ids): lp for i, lp in ev.top_logprobs[: k or 0]}
            top.setdefault(tok, ev.logprob)  # vLLM always includes the sampled token
            tops.append(top)
            offsets.append(pos)
            pos += len(tok)
        return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}

    async def _completion_stream(
        self, req: CompletionRequest, model: str, handle: GenerationHandle, as_ids: bool
    ) -> Stream:
        events, first = await self._first(handle)
        chunk_id, created = new_id("cmpl"), now_s()
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        streamer = TextStreamer(self.tokenizer, handle.params.stop)
        prompt_len = len(handle.prompt_ids)

        def chunk(text: str, **extra: Any) -> JSON:
            choice: JSON = {"index": 0, "text": text, "logprobs": None, "finish_reason": None, "stop_reason": None}
            choice.update({k: v for k, v in extra.items() if k not in ("weight_version", "usage")})
            body: JSON = {
                "id": chunk_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
            }
            body.update({k: v for k, v in extra.items() if k in ("weight_version", "usage")})
            return body

        interval = req.stream_interval or 1

        async def lines() -> AsyncIterator[str]:
            n_tokens, text_pos, sent_prompt = 0, 0, False
            batch: list[TokenEvent] = []  # tokens sampled but not yet sent
            text = ""

            def flush(extra: JSON) -> str:
                nonlocal text, text_pos
                if req.logprobs is not None:
                    extra["logprobs"] = self._completion_logprobs(batch, req.logprobs, as_ids, text_pos)
                    text_pos += sum(len(t) for t in extra["logprobs"]["tokens"])
                if req.return_token_ids:
                    extra["token_ids"] = [e.token_id for e in batch]
                out, text = _sse(chunk(text, **extra)), ""
                batch.clear()
                return out

            try:
                ev: TokenEvent | Finish | None = first
                while ev is not None:
                    extra: JSON = {}
                    if req.return_token_ids and not sent_prompt:
                        extra["prompt_token_ids"] = handle.prompt_ids
                        sent_prompt = True
                    if isinstance(ev, Finish):
                        if batch:
                            yield flush(extra)
                            extra = {}
                        usage = self._usage(prompt_len, n_tokens)
                        yield _sse(
                            chunk(
                                streamer.finish(),
                                finish_reason=ev.reason,
                                stop_reason=ev.stop_reason,
                                weight_version=ev.version,
                                **extra,
                            )
                        )
                        if include_usage:
                            yield _sse(
                                {
                                    "id": chunk_id,
                                    "object": "text_completion",
                                    "created": created,
                                    "model": model,
                                    "choices": [],
                                    "usage": usage,
                                    "weight_version": ev.version,
                                }
                            )
                        break
                    n_tokens += 1
                    text += streamer.push(ev.token_id)
                    batch.append(ev)
                    if n_tokens == 1 or len(batch) >= interval:
                        yield flush(extra)
                    ev = await anext(events, None)
                yield "data: [DONE]\n\n"
            finally:
                handle.cancel()

        return Stream(version=first.version, lines=lines())

    # --- tokenizer endpoints and models --------------------------------------------------------------------------

    def tokenize(self, req: TokenizeRequest) -> JSON:
        self._check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("send exactly one of `prompt` or `messages`", param="prompt")
        if req.messages is not None:
            ChatCompletionRequest.model_validate({"messages": req.messages})  # same role checks as chat
            tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
            ids = self.render_chat(
                req.messages,
                tools,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                kwargs=req.chat_template_kwargs,
            )
        else:
            ids = list(self.tokenizer.encode(req.prompt or "", add_special_tokens=req.add_special_tokens))
        return {
            "count": len(ids),
            "max_model_len": self.engine.max_model_len,
            "tokens": ids,
            "token_strs": self.tokenizer.token_strs(ids) if req.return_token_strs else None,
            "weight_version": self.engine.version,
        }

    def detokenize(self, req: DetokenizeRequest) -> JSON:
        self._check_model(req.model)
        vocab = len(self.tokenizer)
        if any(t < 0 or t >= vocab for t in req.tokens):
            raise bad_request(f"token ids must be in [0, {vocab})", param="tokens")
        return {"prompt": self.tokenizer.decode(req.tokens), "weight_version": self.engine.version}

    def models(self) -> JSON:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.settings.served_model_name,
                    "object": "model",
                    "created": now_s(),
                    "owned_by": "floe",
                    "root": self.engine.checkpoint_path,
                    "parent": None,
                    "max_model_len": self.engine.max_model_len,
                    "permission": [],
                    "weight_version": self.engine.version,
                }
            ],
        }


def api_error_from(exc: Exception) -> APIError:
    """Map an unexpected exception to a 500 in OpenAI shape (used by the app's catch-all handler)."""
    return APIError(500, f"internal error: {type(exc).__name__}", type="internal_server_error")
