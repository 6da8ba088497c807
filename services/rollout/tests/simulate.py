"""Synthetic multi-turn agent sessions at token level, for property tests and the builder benchmark.

Not a model and not a harness: it renders a ChatML-like conversation with a tiny fixed vocabulary and records
``ModelCallRecorded`` events the way the gateway does, in either tokenization mode:

- ``canonical``: every prompt is the server's render of the harness's messages. The previous answer comes back
  re-rendered: possibly re-tokenized (adjacent pairs merged, the ``[fish, ing]`` → ``[fishing]`` effect) or
  re-serialized by the harness (reformatted tool arguments), so its tokens differ from the sampled ones.
- ``exact``: a call that continues the agent's previous call is sent as previous prompt + previously *sampled* ids
  (+ an end-of-turn token when the answer was truncated) + the new tail; anything else is a fresh render.

Session shapes (``Op``): ordinary turns (``stop``, ``tool_calls`` or truncated ``length`` answers, tool results,
in-flight weight updates), context compaction, sub-agents with their own conversation, and rewrites of older
history. Prompts are delta-encoded against the agent's previous call, like the gateway does.

Vocabulary: 1 ``<|im_start|>``, 2 ``<|im_end|>`` (the end-of-turn token), 3–6 roles, 7 newline, 100–199 text,
600–699 merged (re-tokenized) text, 900 a truncation marker.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from contracts import (
    Event,
    ModelCallRecorded,
    Outcome,
    Protocol,
    RewardPublished,
    SessionFinished,
    SessionRequested,
    SessionState,
    TokenizationMode,
)

__all__ = [
    "EOT",
    "Compact",
    "Op",
    "RewriteOld",
    "SessionPlan",
    "SpawnSub",
    "Turn",
    "random_ops",
    "simulate_group",
    "simulate_groups",
    "simulate_session",
]

IM_START, EOT, SYSTEM, USER, ASSISTANT, TOOL, NEWLINE = 1, 2, 3, 4, 5, 6, 7
TRUNCATED = 900
GEN_PROMPT = (IM_START, ASSISTANT)


@dataclass(frozen=True)
class Turn:
    agent: int = 0
    out_len: int = 8
    finish: str = "tool_calls"  # stop | tool_calls | length
    tool_len: int = 8
    retok: bool = False
    reserialize: bool = False
    weight_bump: bool = False


@dataclass(frozen=True)
class Compact:
    agent: int = 0
    summary_len: int = 8


@dataclass(frozen=True)
class SpawnSub:
    task_len: int = 8


@dataclass(frozen=True)
class RewriteOld:
    agent: int = 0


Op = Turn | Compact | SpawnSub | RewriteOld


@dataclass
class _Agent:
    messages: list[tuple[int, tuple[int, ...]]]
    last_call: int | None = None  # index into the session's calls
    extendable: bool = False
    new_since_call: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)


def _render(messages: list[tuple[int, tuple[int, ...]]]) -> tuple[int, ...]:
    out: list[int] = []
    for role, content in messages:
        out.extend((IM_START, role, *content, EOT, NEWLINE))
    return tuple(out)


def _retokenize(content: tuple[int, ...]) -> tuple[int, ...]:
    """Merge some adjacent pairs into one token: the server's canonical tokenization of a sampled answer."""
    out: list[int] = []
    i = 0
    while i < len(content):
        if i + 1 < len(content) and content[i] % 3 == 0:
            out.append(500 + content[i])
            i += 2
        else:
            out.append(content[i])
            i += 1
    return tuple(out)


def _text(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(100, 200) for _ in range(n))


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def simulate_session(
    session_id: str,
    ops: list[Op],
    mode: TokenizationMode,
    rng: random.Random,
    *,
    system_len: int = 16,
    task_len: int = 8,
    delta: bool = True,
    group_id: str = "",
) -> list[ModelCallRecorded]:
    """Play ``ops`` and return the session's recorded calls in call order (every ``Turn`` is one call)."""
    agents = [_Agent(messages=[(SYSTEM, _text(rng, system_len)), (USER, _text(rng, task_len))])]
    agents[0].new_since_call = list(agents[0].messages)
    sequences: list[tuple[int, ...]] = []
    calls: list[ModelCallRecorded] = []
    version = 0
    for op in ops:
        if isinstance(op, SpawnSub):
            sub = _Agent(messages=[(SYSTEM, _text(rng, max(1, system_len // 2))), (USER, _text(rng, op.task_len))])
            agents.append(sub)
            continue
        agent = agents[op.agent % len(agents)]
        if isinstance(op, Compact):
            agent.messages = [agent.messages[0], (USER, (TRUNCATED, *_text(rng, op.summary_len)))]
            agent.extendable = False
            continue
        if isinstance(op, RewriteOld):
            # Drop the body of the oldest tool result that the model has already answered (harnesses prune old
            # outputs): history *inside* the tip prompt changes, so the next prompt extends no chain.
            # A rewrite that changes nothing is no rewrite (the gateway would still see an extension).
            for i, (role, content) in enumerate(agent.messages[:-2]):
                if role == TOOL and content != (TRUNCATED,):
                    agent.messages[i] = (TOOL, (TRUNCATED,))
                    agent.extendable = False
                    break
            continue
        # ---- a model call
        if op.weight_bump:
            version += 1
        if mode is TokenizationMode.EXACT and agent.extendable and agent.last_call is not None:
            prev = calls[agent.last_call]
            sampled = tuple(prev.completion_token_ids)
            close = () if sampled and sampled[-1] == EOT else (EOT,)
            prompt = sequences[agent.last_call] + close + (NEWLINE,) + _render(agent.new_since_call) + GEN_PROMPT
            del prev
        else:
            prompt = _render(agent.messages) + GEN_PROMPT
        content = _text(rng, op.out_len if op.finish != "length" else max(1, op.out_len))
        completion = content if op.finish == "length" else (*content, EOT)
        logprobs = [-round(rng.uniform(0.0, 8.0), 6) for _ in completion]
        index = len(calls)
        prefix_index: int | None = None
        prefix_len = 0
        base = agent.last_call if agent.last_call is not None else (index - 1 if index else None)
        if delta and base is not None:
            n = _lcp(sequences[base], prompt)
            if n:
                prefix_index, prefix_len = base, n
        calls.append(
            ModelCallRecorded(
                session_id=session_id,
                group_id=group_id,
                call_index=index,
                call_id=f"{session_id}-c{index}",
                protocol=Protocol.OPENAI_CHAT,
                tokenization=mode,
                model="sim",
                weight_version=version,
                prompt_token_ids=list(prompt[prefix_len:]),
                prefix_call_index=prefix_index,
                prefix_len=prefix_len,
                prompt_len=len(prompt),
                completion_token_ids=list(completion),
                completion_logprobs=logprobs,
                finish_reason=op.finish,  # type: ignore[arg-type]
            )
        )
        sequences.append(prompt + completion)
        # The harness records the answer as a message; the server's copy may differ from the sampled tokens.
        canonical = content
        if op.retok:
            canonical = _retokenize(canonical)
        if op.reserialize:
            canonical = (*tuple(reversed(canonical)), 100)
        tool = (TOOL, _text(rng, op.tool_len))
        agent.messages.extend([(ASSISTANT, canonical), tool])
        agent.new_since_call = [tool]
        agent.last_call = index
        agent.extendable = True
    return calls


def random_ops(
    rng: random.Random,
    turns: int,
    *,
    out_len: tuple[int, int] = (20, 400),
    tool_len: tuple[int, int] = (20, 1500),
    p_length: float = 0.05,
    p_compact: float = 0.02,
    p_sub: float = 0.03,
    p_rewrite: float = 0.01,
    p_weight_bump: float = 0.05,
    p_retok: float = 0.3,
) -> list[Op]:
    """A realistic-looking plan: mostly tool-calling turns, rare truncations, compactions, sub-agents and rewrites."""
    ops: list[Op] = []
    n_agents = 1
    for _ in range(turns):
        r = rng.random()
        if r < p_compact:
            ops.append(Compact(agent=0, summary_len=rng.randint(100, 600)))
        elif r < p_compact + p_sub:
            ops.append(SpawnSub(task_len=rng.randint(50, 300)))
            n_agents += 1
        elif r < p_compact + p_sub + p_rewrite:
            ops.append(RewriteOld(agent=0))
        # Sub-agents take a share of the turns, the main agent the rest.
        agent = 0 if n_agents == 1 or rng.random() < 0.6 else rng.randrange(1, n_agents)
        finish = "length" if rng.random() < p_length else rng.choice(["tool_calls", "tool_calls", "stop"])
        ops.append(
            Turn(
                agent=agent,
                out_len=rng.randint(*out_len),
                finish=finish,
                tool_len=rng.randint(*tool_len),
                retok=rng.random() < p_retok,
                reserialize=False,
                weight_bump=rng.random() < p_weight_bump,
            )
        )
    return ops


@dataclass(frozen=True)
class SessionPlan:
    """How one simulated session of a group ends."""

    turns: int = 4
    status: SessionState = SessionState.DONE
    reward: float = 1.0
    agent_timed_out: bool = False
    outcome: Outcome | None = None  # default: resolved if reward >= 1 else unresolved
    lose_calls: int = 0  # calls the gateway counted but that never reach the rollout service


def simulate_group(
    group_id: str,
    plans: list[SessionPlan],
    rng: random.Random,
    *,
    mode: TokenizationMode = TokenizationMode.EXACT,
    harness: str = "sim",
    task_id: str = "task-1",
    base_time: int = 1_700_000_000_000,
) -> list[Event]:
    """Every event of one GRPO group: requests, calls, ends and rewards, grouped by session (not interleaved)."""
    events: list[Event] = []
    for i, plan in enumerate(plans):
        sid = f"{group_id}-s{i}"
        events.append(
            SessionRequested(
                session_id=sid,
                group_id=group_id,
                task_id=task_id,
                harness=harness,
                metadata={"group_size": str(len(plans))},
                requested_at=base_time,
            )
        )
        ops = random_ops(rng, plan.turns, out_len=(1, 30), tool_len=(1, 40))
        calls = simulate_session(sid, ops, mode, rng, group_id=group_id)
        events.extend(calls[: len(calls) - plan.lose_calls])
        events.append(
            SessionFinished(
                session_id=sid,
                group_id=group_id,
                task_id=task_id,
                harness=harness,
                node_id="node-0",
                status=plan.status,
                agent_timed_out=plan.agent_timed_out,
                calls=len(calls),
                turns=len(calls),
                finished_at=base_time + 1000 + i,
            )
        )
        outcome = plan.outcome or (Outcome.RESOLVED if plan.reward >= 1 else Outcome.UNRESOLVED)
        events.append(
            RewardPublished(
                session_id=sid,
                group_id=group_id,
                task_id=task_id,
                reward=plan.reward,
                outcome=outcome,
                resolved=outcome is Outcome.RESOLVED,
                scored_at=base_time + 2000 + i,
            )
        )
    return events


def simulate_groups(n: int, seed: int = 0, size: int = 3) -> dict[str, list[Event]]:
    """``n`` groups of ``size`` sessions (rewards alternate 0/1; every third group has one infrastructure failure),
    alternating between harnesses ``h0`` and ``h1``."""
    rng = random.Random(seed)
    out = {}
    for g in range(n):
        plans = [SessionPlan(turns=rng.randint(1, 4), reward=float(i % 2)) for i in range(size)]
        if g % 3 == 2:
            plans[0] = SessionPlan(turns=2, status=SessionState.FAILED, reward=0.0)
        out[f"grp-{g:03d}"] = simulate_group(f"grp-{g:03d}", plans, rng, harness=f"h{g % 2}")
    return out
