"""Benchmark the CPU inference engine over HTTP: tokens/s and request latency at several concurrency levels.

Starts ``python -m inference`` as a subprocess on a free port (the tiny dev model unless ``--model-dir`` is given),
then, for each concurrency level, keeps that many streaming-free chat requests in flight and prints a table with
throughput, latency p50/p99 and the throughput ratio against concurrency 1. Also reports model size and the server's
peak resident memory. Default run: well under a minute on 2 cores.

    .venv/bin/python bench/inference/run.py [--concurrency 1 8 32] [--max-tokens 32] [--requests-per-level 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def rss_mib(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def checkpoint_size(model_dir: Path) -> tuple[int, float]:
    """Parameter count (from the safetensors headers) and file size in MiB."""
    params, size = 0, 0
    for f in model_dir.glob("*.safetensors"):
        size += f.stat().st_size
        with f.open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, meta in header.items():
            if name != "__metadata__":
                n = 1
                for d in meta["shape"]:
                    n *= d
                params += n
    return params, size / 2**20


async def one_level(url: str, concurrency: int, total: int, max_tokens: int) -> dict[str, float]:
    latencies: list[float] = []
    tokens = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while not queue.empty():
            i = queue.get_nowait()
            body = {
                "messages": [
                    {"role": "user", "content": f"Task {i}: list the files in the repository and fix the bug."}
                ],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "seed": i,
                "logprobs": True,
                "return_token_ids": True,
            }
            start = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - start)
            resp.raise_for_status()
            tokens += len(resp.json()["choices"][0]["token_ids"])

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "requests": total,
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-per-level", type=int, default=0, help="default: max(4, 2 x concurrency)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        # Without --model-dir the server creates the tiny dev model itself (init_if_missing), so this process never
        # pays for importing torch/transformers.
        model_dir = args.model_dir or Path(tmp) / "dev"
        port = free_port()
        env = {
            **os.environ,
            "FLOE_INFERENCE_MODEL_DIR": str(model_dir),
            "FLOE_INFERENCE_PORT": str(port),
            "FLOE_INFERENCE_CONSUME_WEIGHTS": "false",
            "FLOE_INFERENCE_MAX_BATCH": str(args.max_batch),
            "FLOE_INFERENCE_THREADS": str(args.threads),
        }
        server = subprocess.Popen([sys.executable, "-m", "inference"], env=env, stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("inference server did not start")
                time.sleep(0.2)
            asyncio.run(one_level(url, 1, 2, 4))  # warm-up
            rows = []
            for c in args.concurrency:
                total = args.requests_per_level or max(4, 2 * c)
                rows.append(asyncio.run(one_level(url, c, total, args.max_tokens)))
            rss, peak = rss_mib(server.pid)
            params, weights_mib = checkpoint_size(model_dir)
            cfg = json.loads((model_dir / "config.json").read_text())
        finally:
            server.terminate()
            server.wait(30)

    print(
        f"model: {cfg['model_type']} hidden={cfg['hidden_size']} layers={cfg['num_hidden_layers']} "
        f"heads={cfg['num_attention_heads']}/{cfg['num_key_value_heads']} vocab={cfg['vocab_size']} "
        f"params={params / 1e6:.2f}M weights={weights_mib:.2f} MiB"
    )
    print(f"server memory: rss={rss:.0f} MiB peak={peak:.0f} MiB; max_tokens={args.max_tokens}, threads={args.threads}")
    base = rows[0]["tok_s"]
    print(
        f"{'conc':>5} {'reqs':>5} {'tokens':>7} {'wall s':>7} {'tok/s':>8} {'x conc1':>8} {'p50 ms':>8} {'p99 ms':>8}"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>5} {r['requests']:>5} {r['tokens']:>7} {r['wall_s']:>7.2f} {r['tok_s']:>8.1f} "
            f"{r['tok_s'] / base:>8.2f} {r['p50_ms']:>8.0f} {r['p99_ms']:>8.0f}"
        )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
