"""Real, unmodified agent CLIs against the gateway + the real CPU engine, records on the real broker.

Each CLI (installed by ``deploy/harnesses/install.sh`` into ``$FLOE_HARNESS_HOME/npm/bin``) runs one headless
trivial prompt with its own throwaway HOME, pointed at the gateway exactly as ``docs/harnesses.md`` describes. The
engine's weights are random, so the answer is noise: the test checks that the CLI finishes without a protocol error
and that its calls appear as ``ModelCallRecorded`` events of its session and protocol. A missing CLI fails the test
(run ``make harnesses`` / the install script), it is never skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts import MODEL_CALLS, ModelCallRecorded
from eventbus import Consumer
from gateway import GatewaySettings, create_app

from ._fakes import free_port, serve
from .conftest import CONTROL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HARNESS_HOME = Path(
    os.environ.get("FLOE_HARNESS_HOME")
    or ("/var/cache/floe/harnesses" if os.getuid() == 0 else str(Path.home() / ".cache/floe/harnesses"))
)
PROMPT = "Reply with the word done."


@pytest.fixture(scope="module")
def cli_stack(tmp_path_factory: pytest.TempPathFactory, kafka_settings) -> Iterator[tuple[str, str]]:
    from inference import create_app as create_engine
    from inference.checkpoint import DevModelSpec, init_dev_model
    from inference.settings import InferenceSettings

    model_dir = tmp_path_factory.mktemp("cli-engine") / "model"
    # Claude Code's first request is ~43k tokens under the dev tokenizer: give the engine a 128k context.
    init_dev_model(model_dir, DevModelSpec(max_position_embeddings=131072))
    with serve(create_engine(InferenceSettings(model_dir=model_dir, consume_weights=False, seed=5))) as engine_url:
        port = free_port()
        topic = f"floe.model-calls.cli-{uuid.uuid4().hex[:8]}"
        settings = GatewaySettings(
            engine_urls=[engine_url],
            control_token=CONTROL,
            public_url=f"http://127.0.0.1:{port}",
            model_calls_topic=topic,
            max_tokens_cap=24,
        )
        with serve(create_app(settings, kafka=kafka_settings), port) as url:
            yield url, topic


def _bin(name: str) -> str:
    path = HARNESS_HOME / "npm" / "bin" / name
    assert path.exists(), f"{path} missing: run deploy/harnesses/install.sh"
    return str(path)


def _setup(cli: str, home: Path, url: str, token: str) -> tuple[list[str], dict[str, str]]:
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
        return [_bin("codex"), "exec", "--skip-git-repo-check", PROMPT], env
    if cli == "claude-code":
        env.update(
            ANTHROPIC_BASE_URL=url,
            ANTHROPIC_API_KEY=token,
            ANTHROPIC_MODEL="policy",
            ANTHROPIC_DEFAULT_HAIKU_MODEL="policy",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        # Only the Bash tool: the full built-in tool set is ~43k prompt tokens, minutes of CPU prefill per call.
        return [_bin("claude"), "-p", PROMPT, "--tools", "Bash"], env
    if cli == "qwen-code":
        (home / ".qwen").mkdir()
        (home / ".qwen" / "settings.json").write_text(json.dumps({"memory": {"enableManagedAutoMemory": False}}))
        env.update(OPENAI_API_KEY=token, OPENAI_BASE_URL=f"{url}/v1", OPENAI_MODEL="policy")
        return [_bin("qwen"), "--auth-type", "openai", "-m", "policy", PROMPT], env
    if cli == "pi":
        (home / ".pi" / "agent").mkdir(parents=True)
        (home / ".pi" / "agent" / "models.json").write_text(
            json.dumps(
                {
                    "providers": {
                        "local": {
                            "baseUrl": f"{url}/v1",
                            "api": "openai-completions",
                            "apiKey": "LOCAL_API_KEY",
                            "models": [{"id": "policy"}],
                        }
                    }
                }
            )
        )
        env.update(LOCAL_API_KEY=token)
        return [_bin("pi"), "-p", "--provider", "local", "--model", "policy", PROMPT], env
    if cli == "gemini-cli":
        (home / ".gemini").mkdir()
        (home / ".gemini" / "settings.json").write_text(
            json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}})
        )
        env.update(
            GEMINI_API_KEY=token, GOOGLE_GEMINI_BASE_URL=url, GEMINI_MODEL="policy", GEMINI_CLI_TRUST_WORKSPACE="true"
        )
        return [_bin("gemini"), "-p", PROMPT], env
    raise AssertionError(cli)


LENGTH_STOP = {
    "codex": "Incomplete response returned, reason: max_output_tokens",
    "claude-code": "response exceeded the 32000 output token maximum",
}
PROTOCOL = {
    "codex": "openai_responses",
    "claude-code": "anthropic_messages",
    "qwen-code": "openai_chat",
    "pi": "openai_chat",
    "gemini-cli": "google_generate",
}


async def _records_of(kafka_settings, topic: str, session_id: str, timeout_s: float = 30) -> list[ModelCallRecorded]:
    out: list[ModelCallRecorded] = []

    async def collect() -> None:
        async with Consumer(kafka_settings, [MODEL_CALLS.with_name(topic)], group_id=f"t-{uuid.uuid4().hex}") as c:
            async for msg in c:
                if msg.event.session_id == session_id:
                    out.append(msg.event)
                    return

    await asyncio.wait_for(collect(), timeout_s)
    return out


@pytest.mark.parametrize("cli", ["pi", "qwen-code", "claude-code", "codex", "gemini-cli"])
async def test_cli_headless_run_is_recorded(cli: str, cli_stack, kafka_settings, tmp_path: Path) -> None:
    url, topic = cli_stack
    sid = f"cli-{cli}-{uuid.uuid4().hex[:6]}"
    token = httpx.post(
        url + "/admin/sessions",
        json={"session_id": sid, "model": "policy"},
        headers={"authorization": f"Bearer {CONTROL}"},
    ).json()["token"]
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    argv, env = _setup(cli, home, url, token)
    proc = await asyncio.to_thread(
        subprocess.run, argv, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240
    )
    tail = f"rc={proc.returncode}\nstdout:{proc.stdout[-1500:]}\nstderr:{proc.stderr[-2500:]}"
    if proc.returncode != 0 and cli in LENGTH_STOP:
        # Random weights rarely sample end-of-turn, so capped answers end with a length stop, which the gateway
        # reports faithfully (Responses ``response.incomplete``, Anthropic ``stop_reason: max_tokens``); these CLIs
        # then exit 1 by design. That is a clean protocol exchange, not an error of ours.
        assert LENGTH_STOP[cli] in proc.stdout + proc.stderr, tail
    else:
        assert proc.returncode == 0, tail
    recs = await _records_of(kafka_settings, topic, sid)
    assert recs and recs[0].protocol.value == PROTOCOL[cli], tail
    assert recs[0].completion_token_ids and len(recs[0].completion_logprobs) == len(recs[0].completion_token_ids)
