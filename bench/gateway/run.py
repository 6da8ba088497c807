"""Gateway benchmark: what the gateway costs and saves, side by side in one run.

Prints, against the real floe CPU engine (``python -m inference`` in a subprocess, tiny random model):

1. streaming time-to-first-token, direct to the engine vs through the gateway (OpenAI Chat SSE);
2. added latency of a whole non-streaming call (gateway - direct, paired calls, same seed), p50 / p99;
3. calls/s at 1 / 16 / 64 concurrent sessions, direct vs gateway;
4. Kafka bytes of one long exact-mode session (many turns), with vs without prompt delta encoding.

The gateway runs in its own process with a sink that encodes each ``ModelCallRecorded`` exactly as the producer
would (``contracts.encode``) and counts the bytes (``floe_gateway_record_bytes_total``), so no broker is needed;
Kafka stores those bytes before any compression. A second gateway with ``delta_encoding=false`` serves the
no-delta run. Engine, gateways and this client are separate processes on one machine, so they compete for cores.

    .venv/bin/python bench/gateway/run.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from pydantic import SecretStr

from contracts import TokenizationMode, encode
from gateway import GatewaySettings, create_app

CONTROL = "bench-control"


class ByteSink:
    def __init__(self) -> None:
        self.bytes = 0
        self.count = 0

    async def send(self, topic: Any, event: Any) -> None:
        self.bytes += len(encode(event))
        self.count += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(model_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "FLOE_INFERENCE_MODEL_DIR": str(model_dir),
        "FLOE_INFERENCE_PORT": str(port),
        "FLOE_INFERENCE_CONSUME_WEIGHTS": "false",
        "FLOE_INFERENCE_MAX_BATCH": "64",
        "FLOE_INFERENCE_SEED": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "inference"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("engine did not start")


def serve_gateway(engine_url: str, port: int, delta: bool) -> None:
    """Subprocess entry: the gateway with a byte-counting sink (no broker needed); bytes show in /metrics."""
    settings = GatewaySettings(
        engine_urls=[engine_url],
        control_token=SecretStr(CONTROL),
        public_url=f"http://127.0.0.1:{port}",
        delta_encoding=delta,
    )
    uvicorn.run(create_app(settings, sink=ByteSink()), host="127.0.0.1", port=port, log_level="warning")


def start_gateway(engine_url: str, delta: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, __file__, "--serve-gateway", engine_url, str(port)] + ([] if delta else ["--no-delta"])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("gateway did not start")


def record_bytes(gw: str) -> tuple[float, float]:
    text = httpx.get(gw + "/metrics").text
    b = next(float(x.split()[1]) for x in text.splitlines() if x.startswith("floe_gateway_record_bytes_total "))
    n = sum(
        float(x.split()[1])
        for x in text.splitlines()
        if x.startswith("floe_gateway_calls_total{") and 'status="ok"' in x
    )
    return b, n


def session(gw: str, sid: str, mode: TokenizationMode = TokenizationMode.CANONICAL) -> str:
    r = httpx.post(
        gw + "/admin/sessions",
        json={"session_id": sid, "tokenization": mode.value, "model": "policy"},
        headers={"authorization": f"Bearer {CONTROL}"},
    )
    r.raise_for_status()
    return str(r.json()["token"])


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def ttft(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            ch = (chunk.get("choices") or [{}])[0]
            if (
                ch.get("token_ids")
                or (ch.get("delta") or {}).get("content")
                or (ch.get("delta") or {}).get("tool_calls")
            ):
                return time.perf_counter() - t0
    return time.perf_counter() - t0


async def call(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    if body.get("stream"):
        async with client.stream("POST", url, json=body, headers=headers) as r:
            r.raise_for_status()
            async for _ in r.aiter_bytes():
                pass
    else:
        r = await client.post(url, json=body, headers=headers)
        r.raise_for_status()
    return time.perf_counter() - t0


async def throughput(
    client: httpx.AsyncClient, url: str, headers_for: Any, body: dict[str, Any], conc: int, per_session: int
) -> float:
    async def worker(i: int) -> None:
        h = headers_for(i)
        for _ in range(per_session):
            await call(client, url, h, body)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(conc)))
    return conc * per_session / (time.perf_counter() - t0)


async def long_session_bytes(gw: str, turns: int, client: httpx.AsyncClient) -> tuple[float, float]:
    tok = session(gw, "long", TokenizationMode.EXACT)
    h = {"authorization": f"Bearer {tok}"}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " * 40}]
    b0, n0 = record_bytes(gw)
    for t in range(turns):
        msgs.append({"role": "user", "content": f"step {t}: run the tests and report " + "output line\n" * 10})
        r = await client.post(
            gw + "/v1/chat/completions",
            headers=h,
            json={"model": "policy", "messages": msgs, "max_tokens": 24, "seed": t},
        )
        r.raise_for_status()
        msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})
    b1, n1 = record_bytes(gw)
    return b1 - b0, n1 - n0


async def main_async(quick: bool) -> None:
    n_lat = 10 if quick else 40
    turns = 12 if quick else 40
    # Enough calls that each throughput point lasts seconds, not a few hundred milliseconds (noise dominated).
    per_session = 4 if quick else 15
    tmp = Path(tempfile.mkdtemp(prefix="floe-bench-gw-"))
    proc, engine = start_engine(tmp / "model")
    gw_proc, gw = start_gateway(engine, delta=True)
    nodelta_proc, gw_nodelta = start_gateway(engine, delta=False)
    try:
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=200)) as client:
            body = {
                "model": "policy",
                "messages": [{"role": "user", "content": "write a haiku about kafka"}],
                "max_tokens": 16,
                "seed": 3,
                "temperature": 1.0,
                "top_p": 1.0,
            }
            direct_body = {**body, "return_token_ids": True, "logprobs": True}
            tok = session(gw, "lat")
            gh = {"authorization": f"Bearer {tok}"}
            for _ in range(3):  # warm up both paths
                await call(client, engine + "/v1/chat/completions", {}, direct_body)
                await call(client, gw + "/v1/chat/completions", gh, body)
            t_direct, t_gw, added = [], [], []
            for _ in range(n_lat):
                t_direct.append(await ttft(client, engine + "/v1/chat/completions", {}, direct_body))
                t_gw.append(await ttft(client, gw + "/v1/chat/completions", gh, body))
            for _ in range(n_lat):
                d = await call(client, engine + "/v1/chat/completions", {}, direct_body)
                g = await call(client, gw + "/v1/chat/completions", gh, body)
                added.append(g - d)
            rows = []
            for conc in (1, 16, 64):
                toks = [session(gw, f"tp{conc}-{i}") for i in range(conc)]
                d = await throughput(
                    client, engine + "/v1/chat/completions", lambda i: {}, direct_body, conc, per_session
                )
                g = await throughput(
                    client,
                    gw + "/v1/chat/completions",
                    lambda i, toks=toks: {"authorization": f"Bearer {toks[i]}"},
                    body,
                    conc,
                    per_session,
                )
                # the gateway always streams from the engine: the engine's own SSE path is the fair baseline too
                ds = await throughput(
                    client,
                    engine + "/v1/chat/completions",
                    lambda i: {},
                    {**direct_body, "stream": True},
                    conc,
                    per_session,
                )
                rows.append((conc, d, ds, g))
            b_on, n_on = await long_session_bytes(gw, turns, client)
            b_off, n_off = await long_session_bytes(gw_nodelta, turns, client)
    finally:
        for p in (gw_proc, nodelta_proc, proc):
            p.terminate()
            p.wait(10)

    ms = 1000.0
    print("\nfloe gateway benchmark (CPU engine, tiny random model; engine, gateway and client in 3 processes)")
    print(f"{'metric':44} {'direct':>12} {'gateway':>12} {'ratio':>8}")
    for name, q in (("streaming TTFT p50 (ms)", 50), ("streaming TTFT p99 (ms)", 99)):
        d, g = pct(t_direct, q) * ms, pct(t_gw, q) * ms
        print(f"{name:44} {d:12.2f} {g:12.2f} {g / d:8.2f}")
    print(
        f"{'added latency per call p50 / p99 (ms)':44} {'':>12} {pct(added, 50) * ms:5.2f} / {pct(added, 99) * ms:5.2f}"
    )
    print(f"{'added latency mean (ms)':44} {'':>12} {statistics.mean(added) * ms:12.2f}")
    # The gateway always streams from the engine, so "direct SSE" (the engine's own streaming path) is its floor.
    print(
        f"{'calls/s (non-streaming client)':44} {'direct':>12} {'gateway':>12} {'ratio':>8} {'direct SSE':>12}"
        f" {'gw/SSE':>8}"
    )
    for conc, d, ds, g in rows:
        name = f"calls/s at {conc} concurrent sessions"
        print(f"{name:44} {d:12.2f} {g:12.2f} {g / d:8.2f} {ds:12.2f} {g / ds:8.2f}")
    print(f"{'':44} {'no delta':>12} {'delta':>12} {'ratio':>8}")
    print(f"{f'Kafka bytes, {turns}-turn exact session':44} {b_off:12.0f} {b_on:12.0f} {b_on / b_off:8.3f}")
    print(f"{'Kafka bytes per call':44} {b_off / n_off:12.0f} {b_on / n_on:12.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (about a minute)")
    parser.add_argument("--serve-gateway", nargs=2, metavar=("ENGINE_URL", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--no-delta", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(args.serve_gateway[0], int(args.serve_gateway[1]), delta=not args.no_delta)
        return
    asyncio.run(main_async(args.quick))


if __name__ == "__main__":
    main()
