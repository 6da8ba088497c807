"""The one pipeline every provider route runs: admit, clean, tokenize, stream from the engine, record.

A route does ``turn = Turn(...)``; ``await turn.start()`` (every error before the first token surfaces here, so
it can still become a proper HTTP status); ``async for ev in turn.events()`` (typed canonical events as the engine
samples them); then renders ``turn.result`` as its terminal event.

Flush, then record: ``events()`` yields every content event first, then hands the record to Kafka and waits for
the ack, and only then returns, so the route sends its *terminal* event (Chat ``finish_reason`` chunk + ``[DONE]``,
Anthropic ``message_delta``/``message_stop``, Responses ``response.completed``, Google's ``finishReason`` chunk,
or the whole non-streaming JSON body) after the record is durable. If Kafka does not ack, ``events()`` raises
``RecordUnavailable``: a non-streaming client gets a 503 + retry-after instead of the answer; a streaming client
has seen the content deltas but gets the provider's in-stream error event and no terminal event, so it discards
the partial turn and retries — no turn the harness commits to is missing from the log. A client that leaves
mid-stream is not recorded (it never received the turn).

Training hygiene happens here: volatile text (Claude Code's billing header line) is removed, the session's
sampling policy overrides the harness's values (which are recorded), ``max_tokens`` is clamped to the context left.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from pydantic_core import to_json

from contracts import (
    CallTimings,
    ModelCallRecorded,
    Protocol,
    RequestDelta,
    TokenizationMode,
    encode_prompt,
    encode_request,
    now_ms,
)
from gateway.canonical import (
    CanonicalRequest,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    TurnEvent,
    TurnResult,
    Usage,
    new_call_id,
)
from gateway.errors import ContextOverflow, GatewayError, Paused, UpstreamError
from gateway.metrics import GatewayMetrics
from gateway.output_parser import OutputParser
from gateway.recorder import Recorder
from gateway.registry import ChainEntry, Session
from gateway.settings import GatewaySettings
from gateway.tokenization import ExactPlanner, tools_key
from gateway.upstream import EngineChunk, EngineClient, EngineToolCalls

__all__ = ["Admission", "Gateway", "Turn"]

log = structlog.get_logger()


_MEMORY_AGENT = "You are now acting as the managed memory extraction subagent"
_MAX_SUPERSEDED = 64  # unacknowledged attempts at one call a record names (supersedes_call_ids)


class Admission:
    """Pause/drain for weight syncs: ``pause`` stops admitting calls and waits for in-flight ones."""

    def __init__(self, retry_after_s: float) -> None:
        self.paused = False
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._retry_after_s = retry_after_s

    def enter(self) -> None:
        if self.paused:
            raise Paused("gateway paused for a weight update; retry shortly", retry_after=self._retry_after_s)
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            self._idle.set()

    async def pause(self, timeout_s: float) -> bool:
        """True when every in-flight call finished within ``timeout_s`` (the gateway stays paused either way)."""
        self.paused = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def resume(self) -> None:
        self.paused = False


@dataclass
class Gateway:
    """Everything a turn needs, built once in the app's lifespan."""

    settings: GatewaySettings
    engine: EngineClient
    recorder: Recorder
    metrics: GatewayMetrics
    admission: Admission
    planner: ExactPlanner = field(init=False)
    volatile: list[re.Pattern[str]] = field(init=False)
    delta_encoding: bool = field(init=False)

    def __post_init__(self) -> None:
        # The in-flight gauge reads the admission's count when scraped (no update per call; see Recorder)
        self.metrics.inflight.set_function(lambda: self.admission.inflight)
        self.delta_encoding = self.settings.delta_encoding
        self.planner = ExactPlanner(self.engine)
        self.volatile = [re.compile(p) for p in self.settings.volatile_patterns]


def _clean(req: CanonicalRequest, patterns: list[re.Pattern[str]], changes: list[str]) -> CanonicalRequest:
    if not patterns:
        return req
    msgs: list[Message] = []
    changed = False
    for m in req.messages:
        content = m.content
        if m.role == "system":
            for p in patterns:
                content, n = p.subn("", content)
                if n:
                    changes.append(f"removed_volatile:{p.pattern[:40]}")
            if not content.strip():
                changed = True  # a system message left empty is dropped
                continue
        if content != m.content:
            changed = True
            m = replace(m, content=content)
        msgs.append(m)
    # Most requests carry nothing volatile: then the request itself, not a copy (a dataclass copy on every call).
    return replace(req, messages=msgs) if changed else req


def _effective_sampling(
    session: Session, req: CanonicalRequest, s: GatewaySettings, changes: list[str]
) -> dict[str, Any]:
    asked = req.sampling
    policy = session.sampling
    eff: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "seed"):
        forced = getattr(policy, name)
        mine = asked.get(name)
        if forced is not None:
            eff[name] = forced
            if mine is not None and mine != forced:
                changes.append(f"{name}:{mine}->{forced}")
        elif mine is not None:
            eff[name] = mine
    max_tokens = asked.get("max_tokens") or s.default_max_tokens
    for bound in (policy.max_tokens, s.max_tokens_cap):
        if bound is not None and max_tokens > bound:
            changes.append(f"max_tokens:{max_tokens}->{bound}")
            max_tokens = bound
    eff["max_tokens"] = max_tokens
    if asked.get("stop"):
        eff["stop"] = list(asked["stop"])
    return eff


class Turn:
    def __init__(self, gw: Gateway, session: Session, req: CanonicalRequest, protocol: Protocol) -> None:
        self.gw = gw
        self.session = session
        self.req = req
        self.protocol = protocol
        self.call_id = new_call_id()
        self.result = TurnResult(call_id=self.call_id, model=req.model, created=int(time.time()))
        self.changes: list[str] = []
        self._t0 = time.perf_counter()
        self._started_at = now_ms()
        self._admitted = False
        self._upstream: AsyncIterator[tuple[str, EngineChunk]] | None = None
        self._first: tuple[str, EngineChunk] | None = None
        self._prompt_ids: list[int] = []
        self._plan_parent: ChainEntry | None = None
        self._plan_note = ""
        self._sampling: dict[str, Any] = {}
        # Read by the exact planner only, so a canonical-mode call leaves it empty in its chain entry.
        self._tools_key = ""
        self._queue_ms = 0.0
        self._ttft_ms = 0.0
        self._engine_url = ""
        self._closed = False
        # True once the record is durable: the answer is complete and nothing of this turn waits on anything any more
        self.recorded = False

    # ------------------------------------------------------------------------------------------- start

    async def start(self) -> None:
        gw = self.gw
        gw.recorder.admit()
        gw.admission.enter()
        self._admitted = True
        try:
            await self._prepare()
            assert self._upstream is not None
            try:
                self._first = await self._upstream.__anext__()
            except StopAsyncIteration as exc:
                raise UpstreamError("engine closed the stream without an answer") from exc
        except BaseException as exc:
            await self.aclose(status="error", error=exc)
            raise

    async def _prepare(self) -> None:
        gw, s, req = self.gw, self.gw.settings, self.req
        req = self.req = _clean(req, gw.volatile, self.changes)
        if req.side_call is None and any(
            m.role == "system" and m.content.startswith(_MEMORY_AGENT) for m in req.messages
        ):
            req.side_call = "memory"  # Qwen Code's background memory extraction (docs/harnesses.md, "Side calls")
        self._sampling = _effective_sampling(self.session, req, s, self.changes)
        engine_messages = [m.to_engine() for m in req.messages]
        tools = [t.to_engine() for t in req.tools]
        kw = {"enable_thinking": req.thinking} if req.thinking is not None else None
        sid = self.session.session_id
        if self.session.tokenization is TokenizationMode.EXACT:
            self._tools_key = tools_key(req)
            plan = await gw.planner.plan(self.session, req, engine_messages, tools, kw, self._tools_key)
            prompt, mml = plan.prompt_ids, plan.max_model_len
            self._plan_parent, self._plan_note = plan.extends, plan.note
            gw.metrics.child(gw.metrics.exact_chain, plan.note).inc()
            if plan.extends is None:
                self.changes.append(f"exact:new_chain:{plan.note}" + (f" ({plan.detail})" if plan.detail else ""))
        else:
            await gw.engine.model(sid)
            mml = gw.engine.max_model_len or None
            # The engine reports the prompt ids it rendered; pre-tokenize only when the prompt might not leave room
            # for max_tokens. Bound: a byte-level BPE token covers >= 1 byte, plus a few template tokens per message.
            # (pydantic-core's to_json: the UTF-8 bytes, ~2.5x faster than json.dumps on a long agent's request.)
            bound = len(to_json([engine_messages, tools])) + 16 * (len(engine_messages) + len(tools) + 4)
            prompt = []
            if mml is None or bound + self._sampling["max_tokens"] > mml:
                tok = await gw.engine.tokenize_chat(
                    sid, engine_messages, tools, add_generation_prompt=True, chat_template_kwargs=kw
                )
                prompt, mml = tok.tokens, tok.max_model_len
        self._prompt_ids = prompt
        if mml is not None:
            room = mml - len(prompt)
            if room < 1:
                raise ContextOverflow(len(prompt), mml)
            if self._sampling["max_tokens"] > room:
                self.changes.append(f"max_tokens:{self._sampling['max_tokens']}->{room}:context")
                self._sampling["max_tokens"] = room
        body: dict[str, Any] = {"model": await gw.engine.model(sid), **self._sampling, "return_token_ids": True}
        if self.session.tokenization is TokenizationMode.EXACT:
            body.update(prompt=prompt, logprobs=1)
            path = "/v1/completions"
        else:
            body.update(messages=engine_messages, logprobs=True, top_logprobs=0)
            if tools:
                body["tools"] = tools
            if kw:
                body["chat_template_kwargs"] = kw
            path = "/v1/chat/completions"
        self._queue_ms = (time.perf_counter() - self._t0) * 1000
        self._upstream = gw.engine.stream(sid, path, body, prompt_len=len(prompt), incremental=req.stream).__aiter__()

    # ------------------------------------------------------------------------------------------- events

    async def events(self) -> AsyncIterator[TurnEvent]:
        """Content events as the engine samples; records (durably) before returning."""
        assert self._first is not None, "start() first"
        parser = OutputParser()
        engine_calls = EngineToolCalls()
        ids: list[int] = []
        lps: list[float] = []
        finish: str | None = None
        stop_reason: Any = None
        version: int | None = None
        engine_prompt: list[int] | None = None
        text_parts: list[str] = []
        reasoning_parts: list[str] = []
        ok = False
        error: BaseException | None = None
        try:
            pending: tuple[str, EngineChunk] | None = self._first
            upstream = self._upstream
            assert upstream is not None
            while True:
                if pending is None:
                    try:
                        pending = await upstream.__anext__()
                    except StopAsyncIteration:
                        break
                url, chunk = pending
                pending = None
                self._engine_url = url
                if chunk.token_ids and not ids:
                    # A non-streamed call gets every token at once: its "first token" time is the whole answer's,
                    # recorded as such but kept out of the TTFT histogram.
                    self._ttft_ms = (time.perf_counter() - self._t0) * 1000
                    if self.req.stream:
                        m = self.gw.metrics
                        m.child(m.ttft, self.protocol.value).observe(self._ttft_ms / 1000)
                ids.extend(chunk.token_ids)
                lps.extend(chunk.logprobs)
                version = chunk.weight_version if chunk.weight_version is not None else version
                engine_prompt = chunk.prompt_token_ids or engine_prompt
                finish = chunk.finish_reason or finish
                stop_reason = chunk.stop_reason if chunk.stop_reason is not None else stop_reason
                # Reasoning and tool calls the engine parsed itself (canonical mode), then its text, which the
                # gateway's parser still reads (exact mode: /v1/completions has no tool parser on either engine).
                engine_events: list[TurnEvent] = [ReasoningDelta(chunk.reasoning)] if chunk.reasoning else []
                engine_events += [ToolCallDelta(0, c) for c in engine_calls.feed(chunk.tool_calls, chunk.text)]
                for ev in [*engine_events, *parser.feed(chunk.text)]:
                    ev = self._collect(ev, text_parts, reasoning_parts)
                    yield ev
            for ev in [*parser.finish(), *(ToolCallDelta(0, c) for c in engine_calls.finish())]:
                ev = self._collect(ev, text_parts, reasoning_parts)
                yield ev
            if parser.parse_failures:
                self.gw.metrics.parse_failures.inc(parser.parse_failures)
                self.changes.append(f"tool_call_parse_failures:{parser.parse_failures}")
            if self.session.tokenization is TokenizationMode.CANONICAL:
                if engine_prompt is None:
                    raise UpstreamError("engine did not return prompt_token_ids; is return_token_ids supported?")
                self._prompt_ids = engine_prompt  # what the engine actually conditioned on
            elif engine_prompt is not None and engine_prompt != self._prompt_ids:
                raise UpstreamError("engine reports a prompt different from the token ids sent")
            self.result.text = "".join(text_parts)
            self.result.reasoning = "".join(reasoning_parts)
            self.result.finish_reason = self._finish(finish, stop_reason)
            self.result.usage = Usage(len(self._prompt_ids), len(ids))
            await self._record(ids, lps, version)
            ok = self.recorded = True
        except (GeneratorExit, asyncio.CancelledError):
            self.gw.metrics.client_disconnects.inc()
            error = _ClientLeft("the client left before the answer ended")
            raise
        except Exception as exc:
            error = exc
            raise
        finally:
            await self.aclose(status="ok" if ok else "error", error=error)

    def _collect(self, ev: TurnEvent, text: list[str], reasoning: list[str]) -> TurnEvent:
        """Add ``ev`` to the result; a tool call gets its index in the whole answer (engine and gateway parsers
        number their calls independently)."""
        if isinstance(ev, TextDelta):
            text.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            reasoning.append(ev.text)
        elif isinstance(ev, ToolCallDelta):
            ev = ToolCallDelta(len(self.result.tool_calls), ev.call)
            self.result.tool_calls.append(ev.call)
        return ev

    def _finish(self, finish: str | None, stop_reason: Any) -> Any:
        if finish == "length":
            return "length"
        if finish in ("abort", "error"):
            return finish
        if self.result.tool_calls:
            return "tool_calls"
        if isinstance(stop_reason, str) and stop_reason:
            return "stop_sequence"
        return "stop"

    # ------------------------------------------------------------------------------------------- record

    async def _record(self, ids: list[int], lps: list[float], version: int | None) -> None:
        gw, session = self.gw, self.session
        prompt = self._prompt_ids
        async with session.lock:
            call_index = session.next_call_index
            bases = [(e.call_index, e.sequence) for e in session.chain] if gw.delta_encoding else []
            delta = encode_prompt(prompt, bases)
            extends: bool | None = None
            prev = session.chain[-1] if session.chain else None
            if session.tokenization is TokenizationMode.CANONICAL and prev is not None:
                # The first call has no previous call: null, not a break (counting breaks must not count it).
                extends = prompt[: len(prev.sequence)] == prev.sequence
                if not extends:
                    gw.metrics.prefix_breaks.inc()
            base = None
            if gw.delta_encoding:
                base = next(((e.call_index, e.request) for e in reversed(session.chain) if e.request is not None), None)
            req_delta, whole = _recorded_request(self.req, base, gw.settings.record_request_max_bytes)
            record = ModelCallRecorded(
                session_id=session.session_id,
                group_id=session.group_id,
                call_index=call_index,
                call_id=self.call_id,
                protocol=self.protocol,
                tokenization=session.tokenization,
                model=self.req.model,
                engine_id=self._engine_url,
                weight_version=version or 0,
                prompt_token_ids=list(delta.tail),
                prefix_call_index=delta.prefix_call_index,
                prefix_len=delta.prefix_len,
                prompt_len=delta.prompt_len,
                completion_token_ids=ids,
                completion_logprobs=lps,
                finish_reason=self.result.finish_reason,
                prefix_extends_previous=extends,
                request=req_delta.request,
                request_base_call_index=req_delta.base_call_index,
                request_messages_prefix=req_delta.messages_prefix,
                request_same=list(req_delta.same),
                request_truncated=whole is None,
                sampling=self._sampling,
                gateway_changes=self.changes,
                timings=CallTimings(
                    **{
                        "queue_ms": self._queue_ms,
                        "ttft_ms": self._ttft_ms,
                        "total_ms": (time.perf_counter() - self._t0) * 1000,
                    }
                ),
                started_at=self._started_at,
                supersedes_call_ids=list(session.unacked_call_ids),
            )
            try:
                await gw.recorder.send(record)
            except BaseException:  # a timeout, a failure or the client leaving: the record may land all the same
                session.unacked_call_ids.append(self.call_id)
                # Bounded for a harness that retries through a long outage; an older attempt that lands after all is
                # then a conflict, which masks the session (never trains on an answer the harness did not get).
                del session.unacked_call_ids[:-_MAX_SUPERSEDED]
                raise
            session.unacked_call_ids.clear()
            session.next_call_index += 1
            session.calls_ok += 1
            session.chain.append(
                ChainEntry(
                    call_index=call_index,
                    messages=list(self.req.messages),
                    tools_key=self._tools_key,
                    reply=self.result.as_message(),
                    prompt_ids=prompt,
                    completion_ids=ids,
                    finish_reason=self.result.finish_reason,
                    request=whole,
                )
            )
            del session.chain[: -gw.settings.exact_history]
        gw.metrics.prompt_tokens.inc(len(prompt))
        gw.metrics.completion_tokens.inc(len(ids))
        # debug, not info: one rendered JSON line per call was ~7 % of the gateway's CPU per call (bench/gateway);
        # the counters above and the record itself carry the same facts.
        log.debug(
            "call_recorded",
            session_id=session.session_id,
            turn=call_index,
            prompt_len=len(prompt),
            completion_len=len(ids),
            prefix_len=delta.prefix_len,
            policy_version=version or 0,
        )

    async def aclose(self, *, status: str, error: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._upstream is not None:
            closer = getattr(self._upstream, "aclose", None)
            if closer is not None:
                try:
                    await closer()
                except Exception:  # closing a half-read upstream must not mask the real outcome
                    log.warning("upstream_close_failed", session_id=self.session.session_id)
        m = self.gw.metrics
        if status != "ok":
            # No record for this call: say why, per session (its end reason, SessionFinished.timings_ms) and in a
            # metric, so a session with fewer records than calls is never a mystery.
            self.session.calls_failed += 1
            if isinstance(error, GatewayError):  # e.g. a context overflow, an engine that is down
                why, self.session.last_error = error.kind, f"{error.kind}: {error.message}"
            elif isinstance(error, _ClientLeft):
                why, self.session.last_error = "client_disconnected", f"client_disconnected: {error}"
            elif error is not None:
                why, self.session.last_error = "internal_error", f"internal_error: {type(error).__name__}: {error}"
            else:
                why = "unknown"
            self.session.unrecorded[why] = self.session.unrecorded.get(why, 0) + 1
            m.child(m.unrecorded, why).inc()
        protocol = self.protocol.value  # an enum's value is a Python-level property lookup each time on 3.11
        m.child(m.calls, protocol, status).inc()
        m.child(m.duration, protocol).observe(time.perf_counter() - self._t0)
        if self._admitted:
            self._admitted = False
            self.gw.admission.leave()


class _ClientLeft(Exception):
    """The client went away mid-answer (a closed stream, a cancelled request): why a call has no record."""


def _recorded_request(
    req: CanonicalRequest, base: tuple[int, dict[str, Any]] | None, cap: int
) -> tuple[RequestDelta, dict[str, Any] | None]:
    """What the record carries of ``req``: its delta against ``base`` (or the whole request), within ``cap`` bytes of
    JSON; and the full request a decoder rebuilds from it, or None when it had to be truncated."""
    full = req.to_record()
    delta = encode_request(full, base)
    if len(to_json(delta.request)) <= cap:
        return delta, full
    # Keep the shape, shorten the text: tools by name only, then each message's content to a share of the cap.
    # A truncated record names no base and is no base: nothing downstream could rebuild what follows from it.
    full["tools"] = [t.name for t in req.tools]
    per = max(256, cap // max(1, 2 * len(full["messages"])))
    for m in full["messages"]:
        if isinstance(m.get("content"), str) and len(m["content"]) > per:
            m["content"] = m["content"][:per] + "…"
    while len(to_json(full)) > cap and len(full["messages"]) > 1:
        full["messages"].pop(0)
    return RequestDelta(None, 0, (), full), None
