"""Client of the floe inference engine (vLLM's OpenAI-compatible, token-level API), with session-affine routing.

Endpoints used (field names as in vLLM's ``entrypoints/openai/protocol.py``):

- ``POST /v1/chat/completions`` (canonical mode) with ``return_token_ids``, ``logprobs``, ``top_logprobs=0``,
  ``stream=true``, ``stream_options.include_usage`` and ``stream_interval``. The first chunk carries top-level
  ``prompt_token_ids``; each chunk carries ``choices[0].token_ids`` and ``choices[0].logprobs.content[].logprob``
  for its tokens.
- ``POST /v1/completions`` (exact mode) with ``prompt`` = a list of token ids; chunks carry ``choices[0].text``,
  ``choices[0].token_ids`` and ``choices[0].logprobs.token_logprobs`` (or the chat-style ``content`` list).
- ``POST /tokenize`` (messages + tools, ``add_generation_prompt``) -> ``tokens``, ``max_model_len``;
  ``POST /detokenize``; ``GET /v1/models``.
- The serving weight version comes from a ``weight_version`` field of any chunk or the ``x-floe-weight-version``
  response header.
- Tool calls the engine parsed itself (canonical mode) arrive as ``delta.tool_calls`` entries keyed by ``index``:
  the CPU engine sends each call whole in one entry, vLLM in fragments (``id`` and ``function.name`` first, then
  pieces of ``function.arguments``). ``EngineToolCalls`` assembles both into whole calls.

The gateway streams from the engine when its client streams; for a client that waits for the whole answer it asks the
engine for the whole answer (one read, not one wake-up per token: most of the gateway's CPU per call was spent on
those). Both arrive as ``EngineChunk`` values, so the pipeline after the parser has one code path. A streamed
request also carries vLLM's ``stream_interval`` (``GatewaySettings.engine_stream_interval``, 16 by default): the
engine sends the first token at once, then chunks of that many tokens, the rest with the end. Each event costs a
wake-up, a parse and a write in every hop that relays it (engine, gateway, harness), and a harness under training
acts on whole turns, not on single tokens; each chunk still carries the ids and logprobs of all its tokens.

Routing: a consistent-hash ring (64 virtual nodes per replica) maps ``session_id`` to a replica so a session's
calls hit the same prefix cache; a replica that refuses a connection is skipped for ``engine_unhealthy_s`` and the
session fails over to the next replica on the ring. Failover happens only before any byte of an answer was read.

HTTP is ``gateway.engine_http`` (keep-alive pool, httptools parser): on this hop httpx cost more CPU per call than the
rest of the gateway. Its errors are mapped once, in ``map_engine_errors`` (style #7).
"""

from __future__ import annotations

import array
import bisect
import contextlib
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import structlog
from pydantic_core import from_json, to_json

from gateway.canonical import ToolCall, new_call_id
from gateway.engine_http import ConnectFailed, EngineHTTP, HTTPError, Response, Timeout
from gateway.errors import ContextOverflow, InvalidRequest, UpstreamError, UpstreamUnavailable

__all__ = ["EngineChunk", "EngineClient", "EngineToolCalls", "HashRing", "Tokenized", "map_engine_errors"]

log = structlog.get_logger()

_OVERFLOW_MARKERS = ("maximum context length", "context length", "too long", "max_model_len")
_MEMO_KEYS = 65536  # session ids whose ring order HashRing keeps (a few MB at most)


class HashRing:
    """Consistent hashing of session ids onto replica URLs."""

    def __init__(self, nodes: list[str], vnodes: int = 64) -> None:
        if not nodes:
            raise ValueError("at least one engine URL is needed")
        self.nodes = list(dict.fromkeys(n.rstrip("/") for n in nodes))
        points = [(self._h(f"{n}#{i}"), n) for n in self.nodes for i in range(vnodes)]
        points.sort()
        self._keys = [p[0] for p in points]
        self._vals = [p[1] for p in points]
        # Each session asks on every call: its order, computed once (bounded: cleared when full, recomputed alike)
        self._orders: dict[str, tuple[str, ...]] = {}

    @staticmethod
    def _h(s: str) -> int:
        return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")

    def order(self, key: str) -> tuple[str, ...]:
        """Replicas in preference order for ``key``: its owner first, then the next distinct ones on the ring."""
        found = self._orders.get(key)
        if found is None:
            if len(self._orders) >= _MEMO_KEYS:
                self._orders.clear()
            found = self._orders[key] = tuple(self._walk(key))
        return found

    def _walk(self, key: str) -> list[str]:
        start = bisect.bisect(self._keys, self._h(key)) % len(self._keys)
        out: list[str] = []
        for i in range(len(self._keys)):
            node = self._vals[(start + i) % len(self._keys)]
            if node not in out:
                out.append(node)
                if len(out) == len(self.nodes):
                    break
        return out


class _EngineErrors:
    """The context manager of ``map_engine_errors``: a class, not ``@contextlib.contextmanager``, since it wraps every
    engine request and a generator-based one costs about three times the Python calls to enter and leave."""

    __slots__ = ("_url",)

    def __init__(self, url: str) -> None:
        self._url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            return
        url = self._url
        if isinstance(exc, ConnectFailed):
            raise UpstreamUnavailable(f"engine {url} unreachable") from exc
        if isinstance(exc, Timeout):
            raise UpstreamError(f"engine {url} timed out") from exc
        if isinstance(exc, HTTPError):
            raise UpstreamError(f"engine {url} transport error: {exc}") from exc


def map_engine_errors(url: str) -> _EngineErrors:
    """``with map_engine_errors(url):`` the engine hop's transport errors, raised as the gateway's own (unreachable:
    ``UpstreamUnavailable``; timeouts and other transport errors: ``UpstreamError``); anything else passes."""
    return _EngineErrors(url)


@dataclass
class EngineChunk:
    """Tokens the engine sampled since the previous chunk (``token_ids`` and ``logprobs`` aligned)."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    prompt_token_ids: list[int] | None = None
    weight_version: int | None = None
    usage: dict[str, int] | None = None


@dataclass(frozen=True)
class Tokenized:
    tokens: list[int]
    max_model_len: int | None


@dataclass
class _CallParts:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class EngineToolCalls:
    """Whole tool calls from the engine's streamed ``delta.tool_calls`` fragments.

    A call is complete once a fragment of a later call arrives, once text follows it (engine parsers only emit
    content outside calls), or at the end of the stream (``finish``); until then it is held back, because the
    gateway's canonical stream carries whole calls only. An entry without an ``index`` is a call of its own. The
    first ``id`` and ``function.name`` of a call win (vLLM sends each once); ``arguments`` fragments are
    concatenated."""

    def __init__(self) -> None:
        self._open: dict[int, _CallParts] = {}
        self._next = 0

    def feed(self, fragments: list[dict[str, Any]], text: str) -> list[ToolCall]:
        if not fragments and not self._open:
            return []  # the common chunk: text only, no call open (this runs once per sampled token)
        done: list[ToolCall] = []
        if text and not fragments:
            done += self.finish()
        for frag in fragments:
            idx = frag.get("index")
            idx = idx if isinstance(idx, int) else self._next
            if idx not in self._open:
                done += self._close(before=idx)
                self._open[idx] = _CallParts()
                self._next = max(self._next, idx + 1)
            parts = self._open[idx]
            fn = frag.get("function") or {}
            parts.id = parts.id or (str(frag["id"]) if frag.get("id") else None)
            parts.name = parts.name or (fn["name"] if isinstance(fn.get("name"), str) and fn["name"] else None)
            args = fn.get("arguments")
            if isinstance(args, str):
                parts.arguments.append(args)
            elif args is not None:
                parts.arguments.append(json.dumps(args, ensure_ascii=False))
        return done

    def finish(self) -> list[ToolCall]:
        return self._close(before=None)

    def _close(self, *, before: int | None) -> list[ToolCall]:
        """Close the open calls with an index below ``before`` (all of them when None), in index order."""
        out: list[ToolCall] = []
        for idx in sorted(i for i in self._open if before is None or i < before):
            parts = self._open.pop(idx)
            if parts.name is None:
                raise UpstreamError(f"engine sent tool call {idx} without a name")
            out.append(ToolCall(parts.id or f"call_{new_call_id()}", parts.name, "".join(parts.arguments) or "{}"))
        return out


def _logprobs_of(choice: dict[str, Any]) -> list[float]:
    lp = choice.get("logprobs")
    if not lp:
        return []
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        return [float(e["logprob"]) for e in lp["content"]]
    if isinstance(lp, dict) and isinstance(lp.get("token_logprobs"), list):
        return [float(x) for x in lp["token_logprobs"]]
    raise UpstreamError("engine returned logprobs in an unknown shape")


def _ids(value: Any) -> list[int]:
    """Token ids as the engine sent them, checked to be integers. ``array`` checks a list in C, ~3x faster than
    ``list(map(int, ...))`` on the ~30K prompt ids of a long agent session's call; anything else is converted."""
    if type(value) is list:
        try:
            array.array("q", value)
        except (TypeError, OverflowError):
            pass
        else:
            return value
    return list(map(int, value))


def _parse_chunk(data: dict[str, Any], header_version: int | None) -> EngineChunk:
    if "error" in data and not data.get("choices"):
        err = data["error"]
        msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        raise UpstreamError(f"engine stream error: {msg}")
    chunk = EngineChunk(weight_version=header_version)
    if data.get("weight_version") is not None:
        chunk.weight_version = int(data["weight_version"])
    if data.get("prompt_token_ids") is not None:
        chunk.prompt_token_ids = _ids(data["prompt_token_ids"])
    if data.get("usage"):
        chunk.usage = {k: int(v) for k, v in data["usage"].items() if isinstance(v, int)}
    choices = data.get("choices") or []
    if choices:
        c = choices[0]
        delta = c.get("delta") or c.get("message")  # a streamed chunk's delta, or a non-streamed whole answer
        if isinstance(delta, dict):
            chunk.text = delta.get("content") or ""
            chunk.reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            chunk.tool_calls = [t for t in delta.get("tool_calls") or [] if isinstance(t, dict)]
        else:
            chunk.text = c.get("text") or ""
        if c.get("prompt_token_ids") is not None and chunk.prompt_token_ids is None:
            chunk.prompt_token_ids = _ids(c["prompt_token_ids"])
        chunk.token_ids = _ids(c.get("token_ids") or [])
        chunk.logprobs = _logprobs_of(c)
        if len(chunk.logprobs) != len(chunk.token_ids):
            raise UpstreamError(
                f"engine chunk has {len(chunk.token_ids)} token ids but {len(chunk.logprobs)} logprobs; "
                "is return_token_ids supported?"
            )
        chunk.finish_reason = c.get("finish_reason")
        chunk.stop_reason = c.get("stop_reason")
    return chunk


def _raise_for_engine_status(url: str, status: int, body: bytes, prompt_len: int | None) -> None:
    text = body.decode(errors="replace")[:2000]
    try:
        payload = json.loads(text)
        msg = payload.get("error", {}).get("message") or payload.get("message") or payload.get("detail") or text
    except (ValueError, AttributeError):
        msg = text
    msg = str(msg)
    if status == 400 and any(m in msg.lower() for m in _OVERFLOW_MARKERS):
        raise ContextOverflow(prompt_len or 0, _max_len_from(msg))
    if status in (400, 422):
        raise InvalidRequest(f"engine rejected the request: {msg}")
    if status in (502, 503, 504):
        raise UpstreamUnavailable(f"engine {url} unavailable ({status})")
    raise UpstreamError(f"engine {url} answered {status}: {msg[:300]}")


async def _whole_json(url: str, path: str, resp: Response, prompt_len: int | None) -> dict[str, Any]:
    """A whole (non-streamed) answer's JSON; an error status raises the matching gateway error."""
    try:
        with map_engine_errors(url):
            content = await resp.read()
    finally:
        await resp.aclose()
    if resp.status != 200:
        _raise_for_engine_status(url, resp.status, content, prompt_len)
    try:
        return dict(from_json(content))
    except ValueError as exc:
        raise UpstreamError(f"engine {url} sent a non-JSON answer to {path}") from exc


def _max_len_from(msg: str) -> int:
    m = re.search(r"maximum context length is (\d+)", msg) or re.search(r"max_model_len[^\d]*(\d+)", msg)
    return int(m.group(1)) if m else 0


class EngineClient:
    """One connection pool (``EngineHTTP``) over all replicas; ``stream`` is an async generator."""

    def __init__(
        self,
        urls: list[str],
        *,
        model: str | None,
        timeout_s: float,
        connect_timeout_s: float,
        unhealthy_s: float,
        stream_interval: int = 1,
    ) -> None:
        self.ring = HashRing(urls)
        # What a streamed request asks the engine for (vLLM's `stream_interval`); an engine without it ignores it
        self._stream_extra: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
        if stream_interval > 1:
            self._stream_extra["stream_interval"] = stream_interval
        self._model = model
        self.max_model_len: int | None = None
        self._unhealthy_s = unhealthy_s
        self._down_until: dict[str, float] = {}
        self._http = EngineHTTP(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    def replicas(self, session_id: str) -> tuple[str, ...]:
        order = self.ring.order(session_id)
        if self._down_until:
            now = time.monotonic()
            down = {u for u, until in self._down_until.items() if until > now}
            if not down:
                self._down_until.clear()  # every skip has run out: the next calls take the order as it is
            else:
                healthy = tuple(u for u in order if u not in down)
                if healthy:
                    return healthy
        return order

    def _mark_down(self, url: str) -> None:
        self._down_until[url] = time.monotonic() + self._unhealthy_s
        log.warning("engine_replica_down", engine=url, skip_s=self._unhealthy_s)

    async def model(self, session_id: str) -> str:
        if self._model is None or self.max_model_len is None:
            data = await self._get_json(session_id, "/v1/models")
            first = data["data"][0]
            self._model = self._model or str(first["id"])
            mml = first.get("max_model_len")
            self.max_model_len = int(mml) if isinstance(mml, int) else 0  # 0: unknown, learn it from /tokenize
        return self._model

    async def _get_json(self, session_id: str, path: str) -> dict[str, Any]:
        return await self._json(session_id, "GET", path, None)

    async def _post_json(self, session_id: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json(session_id, "POST", path, to_json(body))

    async def _json(self, session_id: str, method: str, path: str, body: bytes | None) -> dict[str, Any]:
        url, resp = await self._open(session_id, method, path, body)
        return await _whole_json(url, path, resp, None)

    async def _open(self, session_id: str, method: str, path: str, body: bytes | None) -> tuple[str, Response]:
        """The response (status and headers in) of the first replica on the session's ring that accepts a
        connection; a replica that refuses is skipped for ``engine_unhealthy_s``."""
        last: Exception | None = None
        for url in self.replicas(session_id):
            try:
                with map_engine_errors(url):
                    return url, await self._http.request(method, url + path, body)
            except UpstreamUnavailable as exc:
                self._mark_down(url)
                last = exc
        raise last or UpstreamUnavailable("no engine replica")

    async def tokenize_chat(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> Tokenized:
        body: dict[str, Any] = {
            "model": await self.model(session_id),
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            body["tools"] = tools
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        data = await self._post_json(session_id, "/tokenize", body)
        mml = data.get("max_model_len")
        if mml:
            self.max_model_len = int(mml)
        return Tokenized([int(t) for t in data["tokens"]], int(mml) if mml else None)

    async def detokenize(self, session_id: str, tokens: list[int]) -> str:
        data = await self._post_json(
            session_id, "/detokenize", {"model": await self.model(session_id), "tokens": tokens}
        )
        return str(data["prompt"])

    async def stream(
        self,
        session_id: str,
        path: str,
        body: dict[str, Any],
        *,
        prompt_len: int | None = None,
        incremental: bool = True,
    ) -> AsyncIterator[tuple[str, EngineChunk]]:
        """POST ``body`` to ``path`` and yield ``(engine_url, chunk)``: one chunk per SSE event, or, with
        ``incremental=False`` (a client that waits for the whole answer anyway), the engine's non-streamed answer as
        one chunk -- one read instead of one per token, the same fields.

        Failover to the next replica only while no answer byte has been read."""
        url, resp = await self._open(
            session_id, "POST", path, to_json({**body, **self._stream_extra} if incremental else body)
        )
        hv = resp.headers.get("x-floe-weight-version")
        header_version = int(hv) if hv and hv.isdigit() else None
        if not incremental or resp.status != 200:
            yield url, _parse_chunk(await _whole_json(url, path, resp, prompt_len), header_version)
            return
        try:
            done = False
            with map_engine_errors(url):
                lines = resp.lines()
                async with contextlib.aclosing(lines):
                    async for line in lines:
                        # After [DONE] the body is read to its end (the chunked terminator, right behind it),
                        # so the connection goes back to the pool for the session's next call.
                        if done or not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            continue
                        try:
                            # pydantic-core's Rust parser: ~2x json.loads on the first chunk's prompt ids
                            parsed = from_json(payload)
                        except ValueError as exc:
                            raise UpstreamError("engine sent a non-JSON SSE data line") from exc
                        yield url, _parse_chunk(parsed, header_version)
        finally:
            await resp.aclose()
