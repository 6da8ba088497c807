"""Every harness preset on a bundled task against the REAL model, over real Kafka (issue 14 item 4).

Stack, exactly as deployed on a gateway node: ``SessionRequested`` on the broker -> session node -> the preset's
real harness CLI in the sandbox -> real gateway -> floe's CPU inference engine as its own process
(``python -m inference``) serving SmolLM2-135M-Instruct (the ``real_model_dir`` checkpoint, its own tokenizer and
chat template, an 8192-token context) -> ``ModelCallRecorded`` + ``SessionFinished`` on the broker.

Each session must end with its calls recorded, one of:

* the harness ran its conversation: DONE, every call the gateway saw is on the broker, in order;
* a prompt of the harness does not fit the model's 8192-token context: the gateway refused it with the provider's
  own context-length error (OpenAI ``context_length_exceeded``, Anthropic ``prompt is too long: N tokens > M
  maximum``, Gemini ``The input token count (N) exceeds ...``) without calling the engine, the harness gave up,
  and the session is FAILED with that refusal in its reason; the calls served before it are recorded;
* on a loaded machine, the agent time budget ran out after at least one recorded call: TIMEOUT, ``agent_timed_out``.

Measured on the 2-core development machine (SmolLM2 in fp32, ``max_tokens`` 8; table in bench/recordings/README.md):
pi, codex, claude-code, opencode and mini-swe-agent fit and end DONE; qwen-code (its main prompt: 10,895 tokens)
and gemini-cli (11,787) are refused. 5 min 22 s for all 7 at load ~2; 22 min under load 7-11 from other jobs (the
cost is the CPU prefill of ~40k prompt tokens). A missing CLI fails the session ("not installed"), never a skip. What
the model says is not checked: ``max_tokens`` is small so each call costs one prefill and a few decode steps.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts import SamplingPolicy, SessionState
from eventbus import Producer
from sessions.node import NodeTopics

from .conftest import request
from .engine_process import cpu_engine_process
from .test_e2e_cpu_engine import Seen, stack  # noqa: F401 - ``stack`` is a fixture, built on our ``cpu_engine``

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TASK = "floe__calx-7"
MAX_TOKENS = 8
# A 7.8k-token prefill of SmolLM2 in fp32 takes ~1.5-4 min on 2 shared cores; Claude Code makes 4 4.5k-token calls.
AGENT_BUDGET_S = 420
HARNESSES = ["pi", "codex", "claude-code", "qwen-code", "gemini-cli", "opencode", "mini-swe-agent"]
CONTEXT = 8192  # SmolLM2-135M-Instruct's max_position_embeddings
# The gateway's refusal as the runner reports it (sessions.runner: "the gateway refused N call(s), the last: ...").
_OVERFLOW = re.compile(
    r"the gateway refused \d+ call\(s\), the last: context_overflow: prompt is too long: (\d+) tokens > (\d+)"
)


def _system(request: dict[str, Any]) -> str:
    """The start of a recorded call's first message: which conversation (main, title, ...) it belongs to."""
    messages = request.get("messages") or [{}]
    return str(messages[0].get("content"))[:40]


@pytest.fixture(scope="module")
def cpu_engine(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m inference`` serving the real SmolLM2 checkpoint (overrides the dev-model engine of ``stack``)."""
    root = tmp_path_factory.mktemp("real-engine")
    env = {
        "FLOE_INFERENCE_MODEL_DIR": str(real_model_dir),
        "FLOE_INFERENCE_INIT_IF_MISSING": "false",
        "FLOE_INFERENCE_CONSUME_WEIGHTS": "false",
        "FLOE_INFERENCE_THREADS": "2",
        # One request at a time: a batch prefill left-pads every prompt to the longest, so OpenCode's title call
        # (~670 tokens) sharing a batch with its 7.8k-token main call would double that prefill's cost.
        "FLOE_INFERENCE_MAX_BATCH": "1",
        "FLOE_INFERENCE_SEED": "7",
    }
    with cpu_engine_process(env, root / "engine.log") as url:
        models = httpx.get(f"{url}/v1/models", timeout=10)
        assert models.json()["data"][0]["max_model_len"] == CONTEXT, models.text
        yield url


@pytest.fixture(autouse=True)
def engine_drained(cpu_engine: str) -> Iterator[None]:
    """After each session, wait until the engine has finished whatever it still computes for it.

    The CPU engine prefills a prompt start to end even when its client has gone (a harness killed at its budget):
    without this, that prefill would eat into the next harness's budget. A one-token request is admitted only once
    the engine thread is free, so its answer is the barrier.
    """
    yield
    body = {"model": "policy", "prompt": [1], "max_tokens": 1}
    httpx.post(f"{cpu_engine}/v1/completions", json=body, timeout=900).raise_for_status()


@pytest.mark.parametrize("harness", HARNESSES)
async def test_harness_preset_on_real_model_ends_with_calls_recorded(
    stack: tuple[NodeTopics, Producer, Seen],  # noqa: F811
    taskset: Any,
    harness: str,
) -> None:
    topics, producer, seen = stack
    req = request(
        taskset,
        harness=harness,
        task_id=TASK,
        task_source="bundled",
        sampling=SamplingPolicy(temperature=1.0, max_tokens=MAX_TOKENS, seed=1),
        agent_timeout_s=AGENT_BUDGET_S,
        session_timeout_s=AGENT_BUDGET_S + 60,
    )
    t0 = time.monotonic()
    await producer.send(topics.requested, req)
    deadline = time.monotonic() + AGENT_BUDGET_S + 90
    while req.session_id not in seen.finished:
        assert time.monotonic() < deadline, f"no result; states so far {seen.states.get(req.session_id)}"
        await asyncio.sleep(0.2)
    finished = seen.finished[req.session_id]
    # Calls and results travel on different topics: give the call records a moment to arrive.
    deadline = time.monotonic() + 30
    while len(seen.calls.get(req.session_id, [])) < finished.turns and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    calls = sorted(seen.calls.get(req.session_id, []), key=lambda c: c.call_index)
    reason = finished.reason or ""
    overflow = _OVERFLOW.search(reason)
    # One line per harness for the table: first prompt in real SmolLM2 tokens, outcome, calls recorded.
    first = calls[0].prompt_len if calls else None
    print(
        f"\nREAL-MODEL {harness}: {finished.status.value} exit={finished.exit_code} recorded={len(calls)} "
        f"prompt_lens={[c.prompt_len for c in calls]} refused_prompt={overflow.group(1) if overflow else None} "
        f"first_recorded={first} {time.monotonic() - t0:.0f}s reason={reason!r} "
        f"systems={[_system(c.request) for c in calls]}"
    )
    detail = f"{reason}\nstdout: {finished.stdout_tail[-1500:]}\nstderr: {finished.stderr_tail[-2500:]}"
    assert seen.states[req.session_id][:4] == ["REQUESTED", "PREPARING", "READY", "RUNNING"], detail
    # Every call the gateway served is on the broker, in order, sampled by the real engine within the cap.
    assert len(calls) == finished.turns, detail
    assert [c.call_index for c in calls] == list(range(len(calls))), detail
    for c in calls:
        assert c.session_id == req.session_id and c.weight_version == 0
        assert 1 <= len(c.completion_token_ids) <= MAX_TOKENS and c.prompt_len <= CONTEXT, detail
        assert len(c.completion_logprobs) == len(c.completion_token_ids)
    if finished.status is SessionState.DONE:
        assert calls, detail
        assert finished.calls == len(calls), detail  # no call refused
    elif finished.status is SessionState.TIMEOUT:
        # A loaded CPU can make a long conversation outlast the agent budget: fine as long as the real model
        # answered and the answers are recorded (the call in flight when the harness was killed is not).
        assert finished.agent_timed_out and calls, detail
    else:
        # The only accepted failure: the gateway refused a prompt longer than the model's context, said so to the
        # harness in its provider's shape, and the session's reason names it.
        assert finished.status is SessionState.FAILED, detail
        assert overflow is not None, detail
        assert int(overflow.group(1)) > CONTEXT and int(overflow.group(2)) == CONTEXT, detail
        assert finished.calls == len(calls) and finished.timings_ms["failed_calls"] >= 1, detail
    assert finished.diff == "" or finished.diff.startswith("diff --git")
