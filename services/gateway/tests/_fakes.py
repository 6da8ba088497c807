"""The fakes of the gateway's unit tests, each for one true external edge (style #13).

- ``FakeEngine``: a tiny real ASGI app served by uvicorn over a real socket, speaking the engine's vLLM-compatible
  token API (``/v1/chat/completions``, ``/v1/completions``: streamed or whole, ``token_ids`` + logprobs, ``/tokenize``,
  ``/detokenize``, ``/v1/models``, ``x-floe-weight-version``). Why: the unit tests need *scripted* answers (tool
  calls, parallel calls, reasoning, length stops) that a random-weight CPU model never produces, and must run in
  milliseconds. Its tokenizer is character level with two special tokens, its chat template ChatML/Hermes-like.
  The end-to-end tests use the real CPU engine (``inference``) instead.
- ``MemorySink``: stands in for ``eventbus.Producer`` in unit tests only (the Kafka integration tests use the real
  broker); ``fail=True`` makes ``send`` raise like an unreachable broker.
- ``serve(app)``: runs any ASGI app with uvicorn on a free loopback port in a thread.

The fake "model" answers from the last user/tool message: ``CALL_TOOL`` -> one tool call, ``TWO_TOOLS`` -> two
parallel calls, ``THINK`` -> a ``<think>`` block then text, ``LONG`` -> 400 characters (length stops),
``SLOW`` -> 51 tokens at 20 ms each,
``BADCALL`` -> malformed tool-call JSON; a tool result -> "The tool said: ..."; otherwise "Hello! You said: ...".
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from eventbus.serving import serve_in_thread

IM_START, IM_END = 1, 2
SPECIAL = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
OFFSET = 10
MAX_MODEL_LEN = 20_000


def encode(text: str) -> list[int]:
    out: list[int] = []
    i = 0
    while i < len(text):
        for tid, s in SPECIAL.items():
            if text.startswith(s, i):
                out.append(tid)
                i += len(s)
                break
        else:
            out.append(ord(text[i]) + OFFSET)
            i += 1
    return out


def decode(ids: list[int], *, skip_special: bool = True) -> str:
    return "".join(SPECIAL[t] if t in SPECIAL else chr(t - OFFSET) for t in ids if not (skip_special and t in SPECIAL))


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool) -> str:
    out = ""
    if tools:
        names = ",".join(t["function"]["name"] for t in tools)
        out += f"<|im_start|>system\nTools: {names}<|im_end|>\n"
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content)
        if m["role"] == "assistant":
            body = ""
            if m.get("reasoning_content"):
                body += f"<think>{m['reasoning_content']}</think>"
            body += content
            for c in m.get("tool_calls") or []:
                args = c["function"]["arguments"]
                args = json.loads(args) if isinstance(args, str) and args else args
                body += "<tool_call>" + json.dumps({"name": c["function"]["name"], "arguments": args}) + "</tool_call>"
            out += f"<|im_start|>assistant\n{body}<|im_end|>\n"
        else:
            out += f"<|im_start|>{m['role']}\n{content}<|im_end|>\n"
    if add_generation_prompt:
        out += "<|im_start|>assistant\n"
    return out


def script(prompt_text: str) -> str:
    turns = prompt_text.split("<|im_start|>")
    last = next((t for t in reversed(turns) if t.startswith(("user\n", "tool\n"))), "user\n")
    role, _, body = last.partition("\n")
    body = body.replace("<|im_end|>", "").strip()
    if role == "tool":
        return f"The tool said: {body[:40]}"
    if "TWO_TOOLS" in body:
        return (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
        )
    if "CALL_TOOL" in body:
        return 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    if "BADCALL" in body:
        return "<tool_call>{not json</tool_call>"
    if "THINK" in body:
        return "<think>I should greet.</think>Hi there."
    if "SLOW" in body:
        return "slow " * 10
    if "LONG" in body:
        return "x" * 400
    return f"Hello! You said: {body[:30]}"


def logprob(i: int) -> float:
    return -0.05 - (i % 7) / 10


class FakeEngine:
    def __init__(self, weight_version: int = 3) -> None:
        self.weight_version = weight_version
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()
        engine = self

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/tokenize")
        async def tokenize(request: Request) -> dict[str, Any]:
            body = await request.json()
            engine.requests.append(("/tokenize", body))
            if "messages" in body:
                text = render(body["messages"], body.get("tools"), body.get("add_generation_prompt", True))
            else:
                text = body["prompt"]
            ids = encode(text)
            return {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids}

        @app.post("/detokenize")
        async def detokenize(request: Request) -> dict[str, Any]:
            body = await request.json()
            return {"prompt": decode(body["tokens"])}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            engine.requests.append(("/v1/chat/completions", body))
            prompt = encode(render(body["messages"], body.get("tools"), True))
            return await engine._generate(body, prompt, chat=True)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            engine.requests.append(("/v1/completions", body))
            prompt = body["prompt"]
            if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
                return JSONResponse({"error": {"message": "prompt must be token ids", "type": "BadRequestError"}}, 400)
            return await engine._generate(body, prompt, chat=False)

        return app

    async def _generate(self, body: dict[str, Any], prompt: list[int], *, chat: bool) -> Any:
        max_tokens = int(body.get("max_tokens") or 16)
        if len(prompt) + max_tokens > MAX_MODEL_LEN:
            msg = (
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens."
            )
            return JSONResponse({"error": {"message": msg, "type": "BadRequestError", "code": 400}}, 400)
        answer = [*encode(script(decode(prompt, skip_special=False))), IM_END]
        finish = "stop"
        if len(answer) > max_tokens:
            answer, finish = answer[:max_tokens], "length"
        version = self.weight_version
        slow = script(decode(prompt, skip_special=False)).startswith("slow ")

        async def gen() -> AsyncIterator[bytes]:
            first: dict[str, Any] = {"id": "x", "object": "chunk", "model": "fake-model"}
            if chat:
                first.update(
                    prompt_token_ids=prompt, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]
                )
                yield f"data: {json.dumps(first)}\n\n".encode()
            for i, tid in enumerate(answer):
                last = i == len(answer) - 1
                text = "" if tid in SPECIAL else chr(tid - OFFSET)
                c: dict[str, Any] = {"index": 0, "token_ids": [tid], "finish_reason": finish if last else None}
                if chat:
                    c["delta"] = {"content": text}
                    c["logprobs"] = {"content": [{"token": text, "logprob": logprob(i)}]}
                else:
                    c["text"] = text
                    c["logprobs"] = {"tokens": [text], "token_logprobs": [logprob(i)]}
                    if i == 0:
                        c["prompt_token_ids"] = prompt
                chunk = {"id": "x", "model": "fake-model", "choices": [c], "weight_version": version}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                await asyncio.sleep(0.02 if slow else 0)
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(answer),
                "total_tokens": len(prompt) + len(answer),
            }
            yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        async def whole() -> JSONResponse:
            # The non-streamed answer (what the gateway asks for when its client does not stream): the same tokens,
            # text and logprobs in one body, vLLM's shape (``message`` for chat, ``text`` for completions).
            if slow:
                await asyncio.sleep(0.02 * len(answer))
            text = "".join("" if tid in SPECIAL else chr(tid - OFFSET) for tid in answer)
            lps = [logprob(i) for i in range(len(answer))]
            c: dict[str, Any] = {"index": 0, "token_ids": answer, "finish_reason": finish}
            out: dict[str, Any] = {"id": "x", "model": "fake-model", "choices": [c], "weight_version": version}
            if chat:
                c["message"] = {"role": "assistant", "content": text}
                c["logprobs"] = {"content": [{"token": "", "logprob": lp} for lp in lps]}
                out["prompt_token_ids"] = prompt
            else:
                c.update(text=text, prompt_token_ids=prompt, logprobs={"tokens": [], "token_logprobs": lps})
            out["usage"] = {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(answer),
                "total_tokens": len(prompt) + len(answer),
            }
            return JSONResponse(out, headers={"x-floe-weight-version": str(version)})

        if not body.get("stream"):
            return await whole()
        return StreamingResponse(gen(), media_type="text/event-stream", headers={"x-floe-weight-version": str(version)})


class MemorySink:
    """Records in memory. ``fail``: every send raises; ``stored`` then says whether the broker kept the record all
    the same (it stalled past the gateway's deadline, then stored what it had been sent)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.events: list[Any] = []
        self.fail = fail
        self.stored = False

    async def send(self, topic: Any, event: Any) -> None:
        if self.fail:
            if self.stored:
                self.events.append(event)
            raise ConnectionError("broker unreachable (fake)")
        self.events.append(event)


serve = serve_in_thread  # what the gateway tests call it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
