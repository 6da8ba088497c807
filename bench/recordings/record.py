"""Record multi-turn sessions of real harness CLIs through the real gateway, as JSONL of ``ModelCallRecorded``.

Role: produce the test data of ``bench/rollout`` and ``bench/learner`` (and ``tests/test_recordings.py``). Stack, all
in this process over real loopback sockets (uvicorn threads):

    harness CLI (subprocess, own HOME) -> gateway (``gateway.create_app``, real)
      -> inference API (``inference.create_app``: real routes, the real SmolLM2-135M-Instruct checkpoint's
         tokenizer and chat template) whose engine is ``ScriptedEngine`` (scripted agent answers)

The scripted engine reports a 256k context (``SCRIPTED_CONTEXT``): several harness prompts are longer than SmolLM2's
8192 positions, which the scripted "model" does not need.

The gateway records into an in-memory sink (``create_app(settings, sink=...)``), which receives exactly the events
it would send to Kafka. Each harness runs the bundled task (``calc.py`` whose ``add`` subtracts, a unittest file) once
per tokenization mode; its events go to ``data/<harness>.<mode>.jsonl.gz`` (``contracts.encode`` per line).

    .venv/bin/python bench/recordings/record.py                       # all harnesses, both modes
    .venv/bin/python bench/recordings/record.py --harness pi --mode exact
    .venv/bin/python bench/recordings/record.py --model-dir /tmp/dev-model   # the dev tokenizer (first recordings)

Limits: needs the CLIs installed by ``deploy/harnesses/install.sh``; a harness that fails is reported and skipped
(its previous recording, if any, is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted_engine import BUGS, PARAMS, TASK_MARKER, ScriptedEngine

import contracts
from contracts import ModelCallRecorded, TokenizationMode
from eventbus.serving import serve_in_thread

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
HARNESSES = ["pi", "codex", "claude-code", "qwen-code", "gemini-cli", "opencode", "mini-swe-agent"]
REAL_MODEL = "smollm2-135m"  # whose tokenizer and chat template the recordings use (``--model-dir`` for another)
# The scripted engine reads prompts of any length: report a context no harness reaches (Claude Code's full tool set
# is ~50k tokens), whatever the checkpoint's own (SmolLM2: 8192).
SCRIPTED_CONTEXT = 262144
CONTROL = "recordings-control"
HARNESS_HOME = Path(
    os.environ.get("FLOE_HARNESS_HOME")
    or ("/var/cache/floe/harnesses" if os.getuid() == 0 else str(Path.home() / ".cache/floe/harnesses"))
)


def calc_source(bug: str) -> str:
    """``calc.py`` with the scripted bug of ``bug`` planted (the others correct)."""
    body = {name: BUGS[name][0] if name == bug else BUGS[name][1] for name in BUGS}
    funcs = "".join(f"\n\ndef {name}({PARAMS[name]}):\n    {line}\n" for name, line in body.items())
    return '"""Tiny arithmetic helpers."""\n' + funcs


TEST_CALC = """import unittest

from calc import add, mul, sub


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)

    def test_sub(self):
        self.assertEqual(sub(5, 3), 2)


if __name__ == "__main__":
    unittest.main()
"""


class MemorySink:
    """Collects the gateway's ``ModelCallRecorded`` events (what it would otherwise send to Kafka)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._lock = threading.Lock()

    async def send(self, topic: Any, event: Any) -> None:
        with self._lock:
            self.events.append(event)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


serve = serve_in_thread


def _bin(name: str) -> str:
    path = HARNESS_HOME / ("mini-swe-agent" if name == "mini" else "npm") / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run deploy/harnesses/install.sh")
    return str(path)


def harness_command(cli: str, home: Path, url: str, token: str, prompt: str) -> tuple[list[str], dict[str, str]]:
    """argv + env for one headless run of ``cli`` pointed at the gateway (docs/harnesses.md)."""
    env = {
        "HOME": str(home),
        "PATH": f"{HARNESS_HOME / 'npm' / 'bin'}:{os.environ['PATH']}",
        "NO_COLOR": "1",
        "CI": "1",
        "TERM": "dumb",
    }
    if cli == "codex":
        codex_home = home / ".codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(
            'model = "policy"\nmodel_provider = "local"\n\n[model_providers.local]\nname = "local"\n'
            f'base_url = "{url}/v1"\nenv_key = "LOCAL_API_KEY"\nwire_api = "responses"\n'
        )
        env.update(CODEX_HOME=str(codex_home), LOCAL_API_KEY=token)
        return [
            _bin("codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            prompt,
        ], env
    if cli == "claude-code":
        # Title call kept on (no CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC): side calls are what we want to record.
        env.update(
            ANTHROPIC_BASE_URL=url,
            ANTHROPIC_API_KEY=token,
            ANTHROPIC_MODEL="policy",
            ANTHROPIC_DEFAULT_HAIKU_MODEL="policy",
        )
        # ``--allowedTools`` is variadic: the prompt must come first (docs/harnesses.md, "Claude Code"); root may not
        # skip permissions.
        return [_bin("claude"), "-p", prompt, "--allowedTools", "Read", "Edit", "Bash", "Agent"], env
    if cli == "qwen-code":
        (home / ".qwen").mkdir()
        # Managed memory extraction stays on: its side call is part of a realistic session.
        (home / ".qwen" / "settings.json").write_text(json.dumps({}))
        env.update(OPENAI_API_KEY=token, OPENAI_BASE_URL=f"{url}/v1", OPENAI_MODEL="policy")
        return [_bin("qwen"), "--auth-type", "openai", "-m", "policy", "--yolo", prompt], env
    if cli == "pi":
        (home / ".pi" / "agent").mkdir(parents=True)
        models = {
            "providers": {
                "local": {
                    "baseUrl": f"{url}/v1",
                    "api": "openai-completions",
                    "apiKey": "LOCAL_API_KEY",
                    "models": [{"id": "policy"}],
                }
            }
        }
        (home / ".pi" / "agent" / "models.json").write_text(json.dumps(models))
        env.update(LOCAL_API_KEY=token)
        return [_bin("pi"), "-p", "--provider", "local", "--model", "policy", prompt], env
    if cli == "gemini-cli":
        (home / ".gemini").mkdir()
        (home / ".gemini" / "settings.json").write_text(
            json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}})
        )
        env.update(
            GEMINI_API_KEY=token, GOOGLE_GEMINI_BASE_URL=url, GEMINI_MODEL="policy", GEMINI_CLI_TRUST_WORKSPACE="true"
        )
        return [_bin("gemini"), "-p", prompt, "--yolo"], env
    if cli == "opencode":
        # As services/sessions/presets/opencode.toml: an openai-compatible provider in the config file.
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": "floe/policy",
            "provider": {
                "floe": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "floe",
                    "options": {"baseURL": f"{url}/v1", "apiKey": token},
                    "models": {"policy": {"name": "policy"}},
                }
            },
        }
        (home / ".config" / "opencode").mkdir(parents=True)
        (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps(config))
        env.update(
            OPENCODE_CONFIG=str(home / ".config" / "opencode" / "opencode.json"),
            OPENCODE_DISABLE_AUTOUPDATE="1",
            OPENCODE_DISABLE_MODELS_FETCH="1",
        )
        return [_bin("opencode"), "run", "--auto", "-m", "floe/policy", prompt], env
    if cli == "mini-swe-agent":
        # As services/sessions/presets/mini-swe-agent.toml: OpenAI Chat through litellm, tool calls only.
        env.update(
            OPENAI_API_KEY=token,
            MSWEA_COST_TRACKING="ignore_errors",
            MSWEA_CONFIGURED="1",
            MSWEA_GLOBAL_CONFIG_DIR=str(home / ".config" / "mini-swe-agent"),
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        env["PATH"] = f"{HARNESS_HOME / 'mini-swe-agent' / 'bin'}:{env['PATH']}"
        return [
            _bin("mini"),
            "-m",
            "openai/policy",
            "-c",
            "mini.yaml",
            "-c",
            f"model.model_kwargs.api_base={url}/v1",
            "-y",
            "--exit-immediately",
            "-o",
            str(home / "trajectory.json"),
            "-t",
            prompt,
        ], env
    raise ValueError(f"unknown harness {cli!r}")


@contextlib.contextmanager
def stack(model_dir: Path, request_max_bytes: int) -> Iterator[tuple[str, MemorySink]]:
    import inference.app
    from gateway import GatewaySettings
    from gateway import create_app as create_gateway
    from inference.checkpoint import DevModelSpec, init_dev_model
    from inference.settings import InferenceSettings

    if not (model_dir / "config.json").exists():
        # Claude Code's first prompt is ~43k tokens under the dev tokenizer: a 128k context.
        init_dev_model(model_dir, DevModelSpec(max_position_embeddings=131072))
    # The one substitution: the inference app builds its engine from this module global.
    setattr(inference.app, "Engine", ScriptedEngine)  # noqa: B010 - the module global its lifespan reads
    ScriptedEngine.context = SCRIPTED_CONTEXT
    engine_app = inference.app.create_app(
        InferenceSettings(model_dir=model_dir, consume_weights=False, accept_any_model=True, seed=0)
    )
    sink = MemorySink()
    with serve(engine_app) as engine_url:
        port = free_port()
        settings = GatewaySettings(
            engine_urls=[engine_url],
            control_token=SecretStr(CONTROL),
            public_url=f"http://127.0.0.1:{port}",
            max_tokens_cap=2048,
            record_request_max_bytes=request_max_bytes,
        )
        with serve(create_gateway(settings, sink=sink), port) as url:
            yield url, sink


def record_one(url: str, sink: MemorySink, cli: str, mode: TokenizationMode, bug: str, timeout_s: float) -> list[Any]:
    sid = f"rec-{cli}-{mode.value}-{bug}-{uuid.uuid4().hex[:6]}"
    resp = httpx.post(
        url + "/admin/sessions",
        json={"session_id": sid, "group_id": f"rec-{cli}", "model": "policy", "tokenization": mode.value},
        headers={"authorization": f"Bearer {CONTROL}"},
    )
    resp.raise_for_status()
    token = resp.json()["token"]
    with tempfile.TemporaryDirectory(prefix=f"floe-rec-{cli}-") as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        (work / "calc.py").write_text(calc_source(bug))
        (work / "test_calc.py").write_text(TEST_CALC)
        git = ["git", "-c", "user.name=floe", "-c", "user.email=floe@localhost"]
        subprocess.run([*git, "init", "-q"], cwd=work, check=False)
        subprocess.run([*git, "add", "."], cwd=work, check=False)
        subprocess.run([*git, "commit", "-qm", "task"], cwd=work, check=False)
        prompt = (
            f"{TASK_MARKER} Repository: {work}\n"
            f"The test test_{bug} fails. Find the bug in calc.py, fix it, and make sure the tests pass."
        )
        argv, env = harness_command(cli, home, url, token, prompt)
        t0 = time.monotonic()
        proc = subprocess.run(
            argv, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
        )
        fixed = BUGS[bug][1] in (work / "calc.py").read_text() and BUGS[bug][0] not in (work / "calc.py").read_text()
        events = [e for e in sink.events if e.session_id == sid]
        print(
            f"{cli:12s} {mode.value:9s} {bug} rc={proc.returncode} calls={len(events)} fixed={fixed} "
            f"{time.monotonic() - t0:.1f}s",
            flush=True,
        )
        if proc.returncode != 0 or not fixed:
            print(f"  stdout: {proc.stdout[-800:]}\n  stderr: {proc.stderr[-1500:]}", flush=True)
    return sorted(events, key=lambda e: e.call_index)


def write_jsonl(path: Path, events: list[ModelCallRecorded]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=9) as f:
        for e in events:
            f.write(contracts.encode(e) + b"\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--harness", action="append", choices=HARNESSES, help="default: all")
    ap.add_argument("--mode", action="append", choices=[m.value for m in TokenizationMode], help="default: both")
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help=f"checkpoint whose tokenizer + chat template the engine uses (default: {REAL_MODEL}, fetched if "
        "missing; a directory without config.json gets the tiny dev model, as the first recordings did)",
    )
    ap.add_argument("--request-max-bytes", type=int, default=16 * 1024, help="gateway's recorded request size cap")
    ap.add_argument("--sessions", type=int, default=3, help="sessions per harness x mode (one bug each, cycling)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per harness run, seconds")
    args = ap.parse_args(argv)
    harnesses = args.harness or HARNESSES
    modes = [TokenizationMode(m) for m in (args.mode or ["exact", "canonical"])]
    failures = 0
    if args.model_dir is None:
        from inference.models import fetch_model
        from inference.settings import CacheSettings

        args.model_dir = fetch_model(REAL_MODEL, CacheSettings().cache).path
    with stack(args.model_dir, args.request_max_bytes) as (url, sink):
        for cli in harnesses:
            for mode in modes:
                events: list[Any] = []
                for i in range(args.sessions):
                    bug = list(BUGS)[i % len(BUGS)]
                    try:
                        session = record_one(url, sink, cli, mode, bug, args.timeout)
                    except (subprocess.TimeoutExpired, FileNotFoundError, httpx.HTTPError) as exc:
                        print(f"{cli:12s} {mode.value:9s} FAILED: {exc}", flush=True)
                        failures += 1
                        continue
                    if len(session) < 2:
                        print(f"{cli:12s} {mode.value:9s} too few calls; session dropped", flush=True)
                        failures += 1
                        continue
                    events += session
                if events:
                    write_jsonl(args.out / f"{cli}.{mode.value}.jsonl.gz", events)
    shutil.rmtree(args.out / "__pycache__", ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
