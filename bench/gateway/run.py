"""Gateway benchmark: what the gateway costs and saves, this tree beside a baseline commit, in one run.

Prints, against the real floe CPU engine (``python -m inference`` in a subprocess, tiny random model), for the
gateway of this tree and the gateway of ``--baseline`` (a git revision, checked out once into a worktree under
``.floe/bench/worktrees`` and run with the same venv; ``--baseline none`` skips it):

1. gateway CPU per call (time on CPU of the gateway's threads, in ns, over sequential calls, streaming and not; the
   median of 10 rounds of 30 calls, the columns interleaved round by round);
2. streaming time-to-first-token, direct to the engine vs through each gateway (OpenAI Chat SSE), two ways: answers
   read to their end, as harnesses read them, and probes that hang up at the first token (a gateway then closes its
   engine connection so that the engine stops, and its next call opens a new one);
3. added latency of a whole non-streaming call (gateway - direct, paired calls, same seed), p50 / p99;
   1 twice: with the gateway alone on the last core, engine and client on the others ("own core": what the gateway's
   code costs, on a core nothing else runs on), and with every process free to run on every core ("shared cores":
   the gateway's CPU then also pays the cache misses of running right after the engine's matrix products on the
   same core). On one core both rows are the shared one. 2-4 run on shared cores (with two cores, pinning would
   make the client and the engine share one and time the scheduler, not the gateway);
4. calls/s at 1 / 16 / 64 concurrent sessions, direct vs each gateway; and gateway CPU per call over one long
   exact-mode agent session (``--turns`` calls, tools, a growing history) on each file-sink gateway but the floor:
   what grows with a session's length (prompt ids, the history the exact planner and the delta encoders read);
5. Kafka bytes of one long exact-mode session (``--turns``, 40 by default) three ways, from the same records:
   naive (every call with its whole prompt ids and whole request, JSON lists), v1 (prompt delta encoding, whole
   request, JSON lists: what ``ModelCallRecorded`` v1 wrote) and this tree's records as written; and how bytes per
   call grow from the first to the last ten calls (linear growth of a session = flat bytes per call).

Each gateway runs on the event loop its own tree's lock installs: uvicorn serves on uvloop where it is importable, and
a baseline whose ``uv.lock`` has no uvloop (before it became a dependency) runs on asyncio's loop, as it was deployed.

A third column, the *floor* (``floor.py``), is the least any proxy on this stack costs: uvicorn and the gateway's
engine hop handing the engine's bytes back untouched (no validation, parsing or record). The bench prints how far
above it this tree is; what the floor itself costs (the event loop, the sockets) no change inside the gateway removes.
Beside it, *floor, no uvicorn* (``floor.py --raw``) forwards the same way on a bare httptools protocol: the difference
is what uvicorn's request cycle costs, the most a server of floe's own for the hot lane could save.
The floor asks the engine for what this tree's gateway asks by default, ``stream_interval`` included (a streamed
answer's tokens in chunks of that many, the first and the end at once). A fourth column, *this tree, one token per
event*, is this tree's gateway with ``FLOE_GATEWAY_ENGINE_STREAM_INTERVAL=1``: the same code, one SSE event per
token as before that setting; it runs 1 and 2 only, since non-streamed calls do not depend on it.

Each gateway runs in its own process with a sink that encodes each ``ModelCallRecorded`` exactly as the producer
would (``contracts.encode``) and counts the bytes, so no broker is needed; Kafka stores those bytes before any
compression. Two more columns (skipped with ``--no-kafka``) run this tree's gateway as deployed, producing its
records to a real broker (``eventbus.broker.LocalBroker``, beside the engine, off the gateways' core) and waiting for
each ack: *this tree, Kafka*, with the gateway's own producer settings, and *Kafka, linger 5 ms*, the same with
eventbus's default linger, which the gateway used before ``record_linger_ms``. What they add over the file sink is the
producer's CPU (librdkafka's threads, the poll thread, the loop's wake-up per ack) and the broker's round trip, which
every call waits for before its end. Engine, gateways and this client are separate processes on one machine, so they
compete for cores: compare columns of one run, not runs. Figures go to ``.floe/bench/gateway.json``.

    .venv/bin/python bench/gateway/run.py [--quick] [--baseline REV|none] [--turns N] [--no-kafka]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

# Nothing of floe is imported at module level: ``--serve-gateway`` runs this file with the baseline tree's sources
# first on sys.path, and those may lack what this tree's code below uses.
if TYPE_CHECKING:
    from contracts import ModelCallRecorded

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report import write

CONTROL = "bench-control"
NO_UVLOOP = "FLOE_BENCH_NO_UVLOOP"  # set for a tree whose lock has no uvloop: its gateway runs on asyncio's loop
FLOOR = "floor"  # the name of the floor column's process (``floor.py``)
FLOOR_RAW = "floor-raw"  # the same forwarding without uvicorn (``floor.py --raw``)
PER_TOKEN = "token"  # the name of this tree's gateway with one SSE event per token (streamed calls only)
KAFKA = "kafka"  # this tree's gateway producing its records to a real broker, as deployed
KAFKA_LINGER = "kafka-linger"  # the same with eventbus's producer linger (the gateway's before record_linger_ms)
KAFKA_SINK = "kafka:"  # a RECORDS argument ``kafka:<bootstrap>``: produce to that broker instead of a file
# Each column's suffix on the keys of .floe/bench/gateway.json (this tree's own keys have none)
TAGS = {
    "now": "",
    "base": "_baseline",
    FLOOR: "_floor",
    FLOOR_RAW: "_floor_raw",
    PER_TOKEN: "_per_token",
    KAFKA: "_kafka",
    KAFKA_LINGER: "_kafka_linger",
}
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BASELINE = "9946ec0"  # main before the engine-hop client, the non-streamed upstream and the front door
SRC_DIRS = [
    "schemas/src",
    "libs/eventbus/src",
    "libs/sandbox/src",
    "libs/tasks/src",
    "services/gateway/src",
    "services/inference/src",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not start")


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
    wait_http(url + "/v1/models", proc, "engine", 120)
    return proc, url


@dataclass(frozen=True)
class Delivery:
    """What the sink reports of a record, as ``eventbus.Producer.send``'s ``Delivery`` does: the bytes it wrote (the
    one field the recorder reads). Not eventbus's own class: the sink also serves baseline trees, whose eventbus may
    predate it."""

    size: int


class RecordSink:  # runs in the gateway subprocess, with that tree's contracts
    """Encodes each record as the producer would and appends it (one JSON line) to ``path``. It reports the bytes
    written, as the producer does, so the gateway's recorder takes the path it takes in production (before, the sink
    returned nothing and the recorder encoded each record a second time only to count its bytes)."""

    def __init__(self, path: str) -> None:
        self._fh = open(path, "ab")  # noqa: SIM115 - lives as long as the gateway process

    async def send(self, topic: Any, event: Any) -> Any:
        from contracts import encode

        data = encode(event)
        self._fh.write(data + b"\n")
        self._fh.flush()
        return Delivery(len(data))


def serve_gateway(engine_url: str, port: int, records: str) -> None:
    """Subprocess entry: a gateway (of whichever tree is first on ``sys.path``) with a file sink, no broker; or, for
    ``records`` = ``kafka:<bootstrap>`` (this tree only), with its own Kafka producer on that broker, as deployed."""
    if os.environ.get(NO_UVLOOP):
        sys.modules["uvloop"] = None  # type: ignore[assignment]  # uvicorn's loop="auto" then runs asyncio's loop
    from pydantic import SecretStr

    from gateway import GatewaySettings, create_app

    try:  # logging as the service configures it (JSON lines at INFO), in this tree and the baseline alike
        from eventbus import configure_logging

        configure_logging("gateway")
    except ImportError:
        pass
    settings = GatewaySettings(
        engine_urls=[engine_url], control_token=SecretStr(CONTROL), public_url=f"http://127.0.0.1:{port}"
    )
    if records.startswith(KAFKA_SINK):
        from eventbus import KafkaSettings

        app = create_app(settings, kafka=KafkaSettings(bootstrap_servers=records.removeprefix(KAFKA_SINK)))
    else:
        app = create_app(settings, sink=RecordSink(records))
    # Served as `python -m gateway` serves it: eventbus.serve, with the heap frozen after startup in a tree that can.
    from eventbus.serving import serve

    can_freeze = "freeze_heap" in inspect.signature(serve).parameters
    extra: dict[str, Any] = {"freeze_heap": True} if can_freeze else {}
    serve(app, "127.0.0.1", port, **extra)


@dataclass
class Gateway:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    records: Path

    def cpu_s(self) -> float:
        """CPU seconds the gateway's threads have run so far, to the nanosecond (``/proc/<pid>/task/*/schedstat``).

        ``/proc/<pid>/stat`` counts clock ticks (10 ms): over 150 calls that is 0.07 ms per call, as coarse as the
        differences measured. The gateway's threads live as long as it does, so summing the live ones loses nothing.
        """
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):  # a thread that ended between listing and reading
                continue
        return total / 1e9


def default_stream_interval() -> int:
    """What this tree's gateway asks the engine for by default (``GatewaySettings.engine_stream_interval``)."""
    from gateway.settings import GatewaySettings

    return int(GatewaySettings.model_fields["engine_stream_interval"].default)


def baseline_tree(rev: str) -> Path:
    """A worktree of ``rev`` (made once), whose sources the baseline gateway runs."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = ROOT / ".floe" / "bench" / "worktrees" / sha[:12]
    if not (tree / "services").is_dir():
        tree.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), sha],
            check=True,
            capture_output=True,
        )
    return tree


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` may run only on ``cpus`` (torch's worker threads included: affinity is per thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):  # a thread that ended between listing and setting
            continue


@dataclass
class Placement:
    """Where the bench's processes run: ``own`` gives the gateways the last core to themselves (see the docstring)."""

    name: str
    own: bool

    def apply(self, gateways: list[int], others: list[int]) -> None:
        """Pin the ``gateways`` and the ``others`` (engine, this client)."""
        cpus = sorted(os.sched_getaffinity(0) | {c for pid in gateways for c in os.sched_getaffinity(pid)})
        everything, last = set(cpus), cpus[-1]
        own = self.own and len(cpus) > 1
        for pid in gateways:
            pin(pid, {last} if own else everything)
        for pid in others:
            pin(pid, everything - {last} if own else everything)


def locks_uvloop(tree: Path) -> bool:
    """Whether ``tree``'s lock file installs uvloop (uvicorn serves on it when it is importable)."""
    lock = tree / "uv.lock"
    return lock.is_file() and 'name = "uvloop"' in lock.read_text()


def start_gateway(
    name: str,
    engine_url: str,
    tree: Path,
    scratch: Path,
    env_extra: dict[str, str] | None = None,
    kafka: str | None = None,
) -> Gateway:
    """A gateway of ``tree`` in a subprocess, recording to a file in ``scratch``, or to the broker ``kafka``."""
    port = free_port()
    records = scratch / f"records-{name}.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / d) for d in SRC_DIRS), **(env_extra or {})}
    if not locks_uvloop(tree):  # the baseline runs on the event loop its own lock gave it, not this venv's
        env[NO_UVLOOP] = "1"
    sink = KAFKA_SINK + kafka if kafka else str(records)
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve-gateway", engine_url, str(port), sink]
    log = (scratch / f"gateway-{name}.log").open("wb")  # kept for a crash's traceback
    proc = subprocess.Popen(argv, env=env, cwd=str(tree), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc, f"gateway {name}", 60)
    return Gateway(name, proc, url, records)


def start_floor(engine_url: str, scratch: Path, stream_interval: int, *, raw: bool = False) -> Gateway:
    """A floor column (``floor.py``): uvicorn and this tree's engine hop, forwarding bytes, nothing else; ``raw``: the
    same on a bare httptools protocol, without uvicorn."""
    name = FLOOR_RAW if raw else FLOOR
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in SRC_DIRS)}
    log = (scratch / f"{name}.log").open("wb")
    floor = str(Path(__file__).resolve().parent / "floor.py")
    argv = [sys.executable, floor, engine_url, str(port), str(stream_interval), *(["--raw"] if raw else [])]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc, name, 60)
    return Gateway(name, proc, url, scratch / "floor-has-no-records")


def session(gw: str, sid: str, mode: str = "canonical") -> str:
    r = httpx.post(
        gw + "/admin/sessions",
        json={"session_id": sid, "tokenization": mode, "model": "policy"},
        headers={"authorization": f"Bearer {CONTROL}"},
    )
    r.raise_for_status()
    return str(r.json()["token"])


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def ttft(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any], *, leave: bool = False
) -> float:
    """Seconds to the first chunk that carries a token. The answer is read to its end, as a harness reads it; with
    ``leave`` the probe hangs up at that first token instead (the gateway then closes its engine connection, so
    that the engine stops sampling, and its next call opens a new one)."""
    t0 = time.perf_counter()
    first = 0.0
    async with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
        async for line in r.aiter_lines():
            if first or not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            ch = (chunk.get("choices") or [{}])[0]
            if (
                ch.get("token_ids")
                or (ch.get("delta") or {}).get("content")
                or (ch.get("delta") or {}).get("tool_calls")
            ):
                first = time.perf_counter() - t0
                if leave:
                    return first
    return first or time.perf_counter() - t0


SHARED, OWN_CORE = Placement("shared cores", own=False), Placement("own core", own=True)

RETRIES = {"count": 0}  # calls resent after a pooled client connection the server had just closed (printed)


async def call(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]) -> float:
    try:
        return await _call(client, url, headers, body)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        # httpx resends nothing itself: a keep-alive connection the server (uvicorn, 5 s idle) closed as this request
        # went out fails before any answer byte. The SDKs harnesses use retry exactly this; so does the bench, once.
        RETRIES["count"] += 1
        return await _call(client, url, headers, body)


async def _call(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]) -> float:
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


async def cpu_per_call(client: httpx.AsyncClient, gw: Gateway, body: dict[str, Any], n: int, tag: str) -> float:
    """Gateway CPU milliseconds per call over ``n`` sequential calls of one session (nothing else runs in it)."""
    sid = f"cpu-{'stream' if body.get('stream') else 'json'}-{tag.replace(' ', '-')}"
    h = {"authorization": f"Bearer {session(gw.url, sid)}"}
    await call(client, gw.url + "/v1/chat/completions", h, body)  # warm: the session's first call, imports
    c0 = gw.cpu_s()
    for _ in range(n):
        await call(client, gw.url + "/v1/chat/completions", h, body)
    return (gw.cpu_s() - c0) / n * 1000


async def long_session(gw: Gateway, turns: int, client: httpx.AsyncClient) -> None:
    """A coding-agent-shaped exact-mode session: a long system prompt, tools, each turn adds a tool result."""
    tok = session(gw.url, "long", "exact")
    h = {"authorization": f"Bearer {tok}"}
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name}: " + "what the tool does and when to use it. " * 12,
                "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]},
            },
        }
        for name in ("bash", "read_file", "write_file", "search")
    ]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " * 40}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"step {t}: run the tests and report " + "output line\n" * 10})
        r = await client.post(
            gw.url + "/v1/chat/completions",
            headers=h,
            json={"model": "policy", "messages": msgs, "tools": tools, "max_tokens": 24, "seed": t},
        )
        r.raise_for_status()
        msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})


def v1_bytes(call: ModelCallRecorded, prompt: tuple[int, ...] | None, request: dict[str, Any]) -> int:
    """Bytes of ``call`` as ModelCallRecorded v1 wrote it (JSON lists, whole request; with ``prompt``: no prompt
    delta either), rendered the way pydantic's ``model_dump_json`` does (compact, UTF-8)."""
    raw = call.model_dump(mode="python")
    # Fields v1 did not have: the request delta (v2), the group (v3), the superseded attempts (v4).
    for key in (
        "request_base_call_index",
        "request_messages_prefix",
        "request_same",
        "group_id",
        "supersedes_call_ids",
    ):
        raw.pop(key)
    raw["schema_version"] = 1
    raw["protocol"] = call.protocol.value
    raw["tokenization"] = call.tokenization.value
    raw["request"] = request
    if prompt is not None:
        raw.update(prompt_token_ids=list(prompt), prefix_call_index=None, prefix_len=0)
    return len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())


@dataclass
class Bytes:
    calls: int
    naive: list[int]
    v1: list[int]
    now: list[int]
    last_prompt_len: int


def session_bytes(records: Path, session_id: str) -> Bytes:
    from contracts import ModelCallRecorded, decode, decode_prompts, decode_requests

    lines = [line for line in records.read_bytes().splitlines() if line]
    pairs = [(len(line), decode(ModelCallRecorded, line)) for line in lines]
    pairs = sorted((p for p in pairs if p[1].session_id == session_id), key=lambda p: p[1].call_index)
    calls = [c for _, c in pairs]
    prompts, requests = decode_prompts(calls), decode_requests(calls)
    return Bytes(
        len(calls),
        naive=[v1_bytes(c, p, r) for c, p, r in zip(calls, prompts, requests, strict=True)],
        v1=[v1_bytes(c, None, r) for c, r in zip(calls, requests, strict=True)],
        now=[n for n, _ in pairs],
        last_prompt_len=calls[-1].prompt_len,
    )


def start_broker(scratch: Path) -> tuple[Any, str, float]:
    """A real Kafka broker for the Kafka columns, its address, and the producer linger the gateway had before it set
    its own (``eventbus.producer_config``'s default)."""
    from eventbus import KafkaSettings
    from eventbus.broker import LocalBroker, free_ports
    from eventbus.producer import producer_config

    broker = LocalBroker.at(scratch / "kafka")
    address = broker.start(*free_ports(2), owner_pid=os.getpid())
    return broker, address, float(producer_config(KafkaSettings())["linger.ms"])


async def main_async(quick: bool, baseline: str, turns: int, kafka: bool) -> dict[str, Any]:
    n_lat = 10 if quick else 40
    n_ttft = 20 if quick else 80
    n_cpu = 30 if quick else 300
    # Enough calls that each throughput point lasts seconds, not a few hundred milliseconds (noise dominated).
    per_session = 4 if quick else 15
    scratch = Path(tempfile.mkdtemp(prefix="floe-bench-gw-"))
    trees = {"this tree": ROOT}
    if baseline != "none":
        trees[f"baseline {baseline}"] = baseline_tree(baseline)
    proc, engine = start_engine(scratch / "model")
    gws: list[Gateway] = []
    broker = None
    try:
        for tree in trees.values():
            gws.append(start_gateway("now" if tree == ROOT else "base", engine, tree, scratch))
        names = dict(zip((g.name for g in gws), trees, strict=True))
        gws.append(start_floor(engine, scratch, default_stream_interval()))
        names[FLOOR] = "floor: proxy only"
        gws.append(start_floor(engine, scratch, default_stream_interval(), raw=True))
        names[FLOOR_RAW] = "floor, no uvicorn"
        gws.append(start_gateway(PER_TOKEN, engine, ROOT, scratch, {"FLOE_GATEWAY_ENGINE_STREAM_INTERVAL": "1"}))
        names[PER_TOKEN] = "this tree, per token"
        if kafka:
            broker, address, linger = start_broker(scratch)
            gws.append(start_gateway(KAFKA, engine, ROOT, scratch, kafka=address))
            names[KAFKA] = "this tree, Kafka"
            linger_env = {"FLOE_GATEWAY_RECORD_LINGER_MS": f"{linger:g}"}
            gws.append(start_gateway(KAFKA_LINGER, engine, ROOT, scratch, linger_env, kafka=address))
            names[KAFKA_LINGER] = f"Kafka, linger {linger:g} ms"
        full = [g for g in gws if g.name != PER_TOKEN]  # the columns of the sections that stream nothing
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
            heads = {g.name: {"authorization": f"Bearer {session(g.url, 'lat')}"} for g in gws}
            for _ in range(3):  # warm up every path
                await call(client, engine + "/v1/chat/completions", {}, direct_body)
                for g in gws:
                    await call(client, g.url + "/v1/chat/completions", heads[g.name], body)
            cpu: dict[str, dict[str, tuple[float, float]]] = {}
            gw_pids, others = [g.proc.pid for g in gws], [proc.pid, os.getpid()]
            broker_pid = broker.pid() if broker is not None else None
            if broker_pid is not None:  # the broker runs beside the engine and this client, off the gateways' core
                others.append(broker_pid)
            # In rounds, every column once per round in a rotating order, and the median round: one column's calls all
            # in a row met whatever the machine did meanwhile (its figures moved by 2x between columns of one run).
            rounds = 3 if quick else 10
            for place in (OWN_CORE, SHARED):
                place.apply(gw_pids, others)
                runs: dict[str, tuple[list[float], list[float]]] = {g.name: ([], []) for g in gws}
                for r in range(rounds):
                    for g in gws[r % len(gws) :] + gws[: r % len(gws)]:
                        for stream, into in ((False, runs[g.name][0]), (True, runs[g.name][1])):
                            tag = f"{place.name}-{r}"
                            into.append(await cpu_per_call(client, g, {**body, "stream": stream}, n_cpu // rounds, tag))
                cpu[place.name] = {n: (statistics.median(a), statistics.median(b)) for n, (a, b) in runs.items()}
            # TTFT two ways: answers read to their end (what harnesses do), and probes that hang up at the first token.
            t_direct: dict[bool, list[float]] = {False: [], True: []}
            t_gw: dict[bool, dict[str, list[float]]] = {leave: {g.name: [] for g in gws} for leave in (False, True)}
            added: dict[str, list[float]] = {g.name: [] for g in full}
            # Interleaved, so load drifts hit every column alike, and in a rotating order: a probe that hangs up leaves
            # the engine finishing (or aborting) that answer while the next probe starts, so a fixed order would always
            # hand the same column that leftover work.
            targets: list[Gateway | None] = [None, *gws]
            for leave in (False, True):
                for i in range(n_ttft):
                    for tg in targets[i % len(targets) :] + targets[: i % len(targets)]:
                        if tg is None:
                            url = engine + "/v1/chat/completions"
                            t_direct[leave].append(await ttft(client, url, {}, direct_body, leave=leave))
                        else:
                            url = tg.url + "/v1/chat/completions"
                            t_gw[leave][tg.name].append(await ttft(client, url, heads[tg.name], body, leave=leave))
            for i in range(n_lat):
                for g in full[i % len(full) :] + full[: i % len(full)]:
                    d = await call(client, engine + "/v1/chat/completions", {}, direct_body)
                    x = await call(client, g.url + "/v1/chat/completions", heads[g.name], body)
                    added[g.name].append(x - d)
            rows = []
            cpu_load: dict[str, dict[int, float]] = {g.name: {} for g in full}
            for conc in (1, 16, 64):
                # the gateway always streams from the engine: the engine's own SSE path is the fair baseline too
                ds = await throughput(
                    client,
                    engine + "/v1/chat/completions",
                    lambda i: {},
                    {**direct_body, "stream": True},
                    conc,
                    per_session,
                )
                per_gw = {}
                for g in full:
                    toks = [session(g.url, f"tp{conc}-{i}") for i in range(conc)]
                    c0 = g.cpu_s()
                    per_gw[g.name] = await throughput(
                        client,
                        g.url + "/v1/chat/completions",
                        lambda i, toks=toks: {"authorization": f"Bearer {toks[i]}"},
                        body,
                        conc,
                        per_session,
                    )
                    cpu_load[g.name][conc] = (g.cpu_s() - c0) / (conc * per_session) * 1000
                rows.append((conc, ds, per_gw))
            # The long session on each gateway (not the floor: it has no exact mode), CPU per call while it runs: the
            # cost of what grows with a session (prompt ids, the history the exact planner and the delta encoders read).
            long_cpu: dict[str, float] = {}
            for g in full:
                if g.name not in (FLOOR, FLOOR_RAW, KAFKA, KAFKA_LINGER):  # no exact mode; the same code as "now"
                    c0 = g.cpu_s()
                    await long_session(g, turns, client)
                    long_cpu[g.name] = (g.cpu_s() - c0) / turns * 1000
            now = next(g for g in gws if g.name == "now")
    finally:
        for p in [g.proc for g in gws] + [proc]:
            p.terminate()
            p.wait(10)
        if broker is not None:
            broker.stop()
    b = session_bytes(now.records, "long")
    return report(gws, names, cpu, cpu_load, t_direct, t_gw, added, rows, b, turns, long_cpu)


def report(
    gws: list[Gateway],
    names: dict[str, str],
    cpu: dict[str, dict[str, tuple[float, float]]],
    cpu_load: dict[str, dict[int, float]],
    t_direct: dict[bool, list[float]],
    t_gw: dict[bool, dict[str, list[float]]],
    added: dict[str, list[float]],
    rows: list[tuple[int, float, dict[str, float]]],
    b: Bytes,
    turns: int,
    long_cpu: dict[str, float],
) -> dict[str, Any]:
    ms = 1000.0
    order = [g.name for g in gws]
    cols = "".join(f"{names[n]:>22}" for n in order)
    print("\nfloe gateway benchmark (CPU engine, tiny random model; engine, gateways and client in separate processes)")
    print(f"{'metric':52}{'direct':>12}{cols}")
    for p, c in cpu.items():
        for i, kind in enumerate(("non-streaming", "streaming")):
            print(
                f"{f'gateway CPU per call, {kind} (ms), {p}':52}{'':>12}" + "".join(f"{c[n][i]:22.2f}" for n in order)
            )
    for leave, how in ((False, "read to the end"), (True, "probe hangs up at it")):
        for q in (50, 99):
            d = pct(t_direct[leave], q) * ms
            print(
                f"{f'streaming TTFT p{q} (ms), {how}':52}{d:12.2f}"
                + "".join(f"{pct(t_gw[leave][n], q) * ms:22.2f}" for n in order)
            )
        d50 = pct(t_direct[leave], 50)
        print(
            f"{f'streaming TTFT p50, gateway / direct, {how}':52}{'':>12}"
            + "".join(f"{pct(t_gw[leave][n], 50) / d50:22.2f}" for n in order)
        )
    na = f"{'n/a':>22}"
    for name, q in (("added latency per call p50 (ms)", 50), ("added latency per call p99 (ms)", 99)):
        print(f"{name:52}{'':>12}" + "".join(f"{pct(added[n], q) * ms:22.2f}" if n in added else na for n in order))
    for conc, ds, per_gw in rows:
        print(
            f"{f'calls/s at {conc} sessions (direct: engine SSE)':52}{ds:12.1f}"
            + "".join(f"{per_gw[n]:22.1f}" if n in per_gw else na for n in order)
        )
        print(
            f"{f'gateway CPU per call at {conc} sessions (ms)':52}{'':>12}"
            + "".join(f"{cpu_load[n][conc]:22.2f}" if n in cpu_load else na for n in order)
        )
    print(
        f"{f'gateway CPU per call, {turns}-call exact-mode session (ms)':52}{'':>12}"
        + "".join(f"{long_cpu[n]:22.2f}" if n in long_cpu else na for n in order)
    )
    print(f"{'  (prompt tokens at its last call)':52}{'':>12}{b.last_prompt_len:22d}")
    for p, c in cpu.items():
        if "base" in c:
            print(
                f"this tree / baseline, {p}: CPU per call {c['now'][0] / c['base'][0]:.2f}x "
                f"(streaming {c['now'][1] / c['base'][1]:.2f}x)"
            )
        if PER_TOKEN in c:
            print(
                f"this tree, streaming, {c['now'][1]:.2f} ms per call vs {c[PER_TOKEN][1]:.2f} ms with one token per "
                f"event, {p}: {c['now'][1] / c[PER_TOKEN][1]:.2f}x"
            )
        print(
            f"this tree above the floor, {p}: {c['now'][0] - c[FLOOR][0]:.2f} ms per call "
            f"(streaming {c['now'][1] - c[FLOOR][1]:.2f} ms); the floor is {c[FLOOR][0] / c['now'][0]:.0%} "
            f"of this tree's CPU per call ({c[FLOOR][1] / c['now'][1]:.0%} streaming)"
        )
        print(
            f"uvicorn's request cycle, {p}: the floor costs {c[FLOOR][0] - c[FLOOR_RAW][0]:+.2f} ms per call "
            f"(streaming {c[FLOOR][1] - c[FLOOR_RAW][1]:+.2f} ms) more than the same forwarding without it "
            f"({c[FLOOR_RAW][0] / c[FLOOR][0]:.2f}x, streaming {c[FLOOR_RAW][1] / c[FLOOR][1]:.2f}x)"
        )
    if KAFKA in order:
        for p, c in cpu.items():
            print(
                f"this tree recording to Kafka vs to a file, {p}: {c[KAFKA][0] - c['now'][0]:+.2f} ms CPU per call "
                f"(streaming {c[KAFKA][1] - c['now'][1]:+.2f} ms); with the producer's former linger "
                f"{c[KAFKA_LINGER][0] - c['now'][0]:+.2f} ms ({c[KAFKA_LINGER][1] - c['now'][1]:+.2f} ms)"
            )
        print(
            f"added latency p50 recording to Kafka: {pct(added[KAFKA], 50) * ms:.2f} ms, with the producer's former "
            f"linger {pct(added[KAFKA_LINGER], 50) * ms:.2f} ms, to a file {pct(added['now'], 50) * ms:.2f} ms"
        )
    tn, t1, tw = sum(b.naive), sum(b.v1), sum(b.now)
    k = min(10, b.calls // 2)
    print(f"\nKafka bytes of one {b.calls}-call exact-mode session (same records, three encodings)")
    from contracts import ModelCallRecorded

    now = f"v{ModelCallRecorded.SCHEMA_VERSION} (this tree)"
    print(f"{'':52}{'naive':>12}{'v1':>14}{now:>16}")
    print(f"{'bytes, whole session':52}{tn:12d}{t1:14d}{tw:16d}")
    print(f"{'naive / encoding':52}{1.0:12.2f}{tn / t1:14.2f}{tn / tw:16.2f}")
    first = [statistics.mean(x[:k]) for x in (b.naive, b.v1, b.now)]
    last = [statistics.mean(x[-k:]) for x in (b.naive, b.v1, b.now)]
    print(f"{f'bytes per call, first {k} calls':52}{first[0]:12.0f}{first[1]:14.0f}{first[2]:16.0f}")
    print(f"{f'bytes per call, last {k} calls':52}{last[0]:12.0f}{last[1]:14.0f}{last[2]:16.0f}")
    print(
        f"{'growth per call (last / first)':52}{last[0] / first[0]:12.2f}{last[1] / first[1]:14.2f}"
        f"{last[2] / first[2]:16.2f}"
    )
    figures: dict[str, Any] = {"turns": turns}
    for n in order:
        tag = TAGS[n]
        # CPU on shared cores keeps the keys earlier runs wrote; the gateway on its own core ends in _own_core
        for place in (SHARED, OWN_CORE):
            where = "_own_core" if place.own else ""
            figures[f"gateway_cpu_ms_per_call{tag}{where}"] = round(cpu[place.name][n][0], 3)
            figures[f"gateway_cpu_ms_per_call_streaming{tag}{where}"] = round(cpu[place.name][n][1], 3)
        if n in long_cpu:
            figures[f"gateway_cpu_ms_per_call_long_session{tag}"] = round(long_cpu[n], 3)
        if n in added:
            figures[f"added_latency_p50_ms{tag}"] = round(pct(added[n], 50) * ms, 3)
            figures[f"added_latency_p99_ms{tag}"] = round(pct(added[n], 99) * ms, 3)
        for leave, how in ((False, ""), (True, "_leave")):
            figures[f"ttft_p50_ms{how}{tag}"] = round(pct(t_gw[leave][n], 50) * ms, 3)
            figures[f"ttft_ratio{how}{tag}"] = round(pct(t_gw[leave][n], 50) / pct(t_direct[leave], 50), 3)
        for conc, _, per_gw in rows:
            if n in per_gw:
                figures[f"calls_per_s_{conc}{tag}"] = round(per_gw[n], 2)
                figures[f"gateway_cpu_ms_per_call_{conc}_sessions{tag}"] = round(cpu_load[n][conc], 3)
    figures["ttft_p50_ms_direct"] = round(pct(t_direct[False], 50) * ms, 3)
    figures["ttft_p50_ms_leave_direct"] = round(pct(t_direct[True], 50) * ms, 3)
    figures["client_retries"] = RETRIES["count"]
    print(f"client calls resent after a stale keep-alive connection: {RETRIES['count']}")
    for conc, ds, _ in rows:
        figures[f"calls_per_s_{conc}_direct_sse"] = round(ds, 2)
    figures.update(
        session_calls=b.calls,
        bytes_naive=tn,
        bytes_v1=t1,
        bytes_v2=tw,
        bytes_ratio=round(tn / tw, 2),
        bytes_ratio_v1=round(tn / t1, 2),
        bytes_per_call_growth_v2=round(last[2] / first[2], 3),
        bytes_per_call_growth_naive=round(last[0] / first[0], 3),
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (about a minute)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare with, or none")
    parser.add_argument("--turns", type=int, default=40, help="calls of the long session (bytes)")
    parser.add_argument(
        "--no-kafka", action="store_true", help="skip the two columns that record to a real broker (no JVM start)"
    )
    parser.add_argument("--serve-gateway", nargs=3, metavar=("ENGINE_URL", "PORT", "RECORDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(args.serve_gateway[0], int(args.serve_gateway[1]), args.serve_gateway[2])
        return
    figures = asyncio.run(main_async(args.quick, args.baseline, args.turns, not args.no_kafka))
    write("gateway", figures)


if __name__ == "__main__":
    main()
