"""A scripted upstream engine for recording harness sessions: the real inference API, a scripted "model".

Role: the recordings need multi-turn agent sessions (tool calls the harness executes, growing histories, side
calls), which the random-weight dev model never produces. So we run the REAL inference service app
(``inference.create_app``: its routes, request validation, chat template rendering with the checkpoint's real
tokenizer — SmolLM2-135M-Instruct's by default, ChatML with a Hermes ``<tools>`` block —, ``prompt_token_ids``,
streaming, Hermes tool-call parsing, errors) and swap only its generation engine for ``ScriptedEngine``. The
scripted engine reads the prompt it was given (decoded with special tokens), decides the agent's next step from the
conversation, encodes that answer with the real tokenizer and streams it token by token.

Logprobs are deterministic pseudo-random negative values (a hash of the prompt length, position and token id mapped
to ``-(0.01 + 3 u^3)``), NOT model logprobs: a teacher-forced pass of the tiny model over 40k-token Claude Code
prompts would cost minutes per call on a shared CPU, and the benchmarks only need plausible, distinct values.

The agent script (``FLOE-TASK`` marker in the user prompt, which names the failing test): read ``calc.py`` and
``test_calc.py``, run the tests, fix the function with the harness's edit tool (or ``sed`` through the shell when
it has none, e.g. Codex), run the tests again, look at the ``git diff``, answer in text. Claude Code first delegates
a look at the repository to a sub-agent (``Agent`` tool, ``FLOE-SUBTASK`` marker; the sub-agent reads the file and
reports). mini-swe-agent, whose every turn must be a tool call, ends with
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``. Side calls without a marker (Claude Code's and OpenCode's titles,
Qwen Code's memory extraction, Gemini CLI's router) get a short, well-formed answer.

Limits: one scripted task; tool arguments are chosen from the tool schemas present in the prompt by name.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

from inference.engine import Engine, Finish, GenerationHandle, TokenEvent
from inference.sampling import SamplingParams

__all__ = ["ScriptedEngine", "next_answer", "pseudo_logprob"]

TASK_MARKER = "FLOE-TASK"
SUBTASK_MARKER = "FLOE-SUBTASK"
MINI_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent ends when a command prints this
# Failing test -> (buggy line, fixed line); the task prompt names the failing test.
# Distinct parameter names keep every old/new line unique in the file, and free of sed regex metacharacters.
BUGS = {
    "add": ("return a - b", "return a + b"),
    "mul": ("return x + y", "return x * y"),
    "sub": ("return n - m", "return m - n"),
}
PARAMS = {"add": "a, b", "mul": "x, y", "sub": "m, n"}


def pseudo_logprob(prompt_len: int, position: int, token_id: int) -> float:
    digest = hashlib.blake2b(f"{prompt_len}:{position}:{token_id}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    return round(-(0.01 + 3.0 * u**3), 6)


def _tools(prompt: str) -> dict[str, set[str]]:
    """Tool name -> parameter names, from the Hermes ``<tools>`` block the chat template rendered."""
    m = re.search(r"<tools>\n(.*?)\n</tools>", prompt, re.S)
    out: dict[str, set[str]] = {}
    if not m:
        return out
    for line in m.group(1).split("\n"):
        try:
            tool = json.loads(line)
        except json.JSONDecodeError:
            continue
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters") or {}
            out[fn["name"]] = set((params.get("properties") or {}) if isinstance(params, dict) else {})
    return out


def _segments(prompt: str) -> list[tuple[str, str]]:
    segs = []
    for raw in prompt.split("<|im_start|>")[1:]:
        role, _, body = raw.partition("\n")
        segs.append((role, body.split("<|im_end|>")[0]))
    return segs


def _call(name: str, args: dict[str, Any]) -> str:
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(args) + "}\n</tool_call>"


def _pick(tools: dict[str, set[str]], *names: str) -> str | None:
    return next((n for n in names if n in tools), None)


def _path_key(params: set[str]) -> str:
    return next((k for k in ("file_path", "absolute_path", "filePath", "path") if k in params), "path")


def _shell(tools: dict[str, set[str]], command: str, why: str) -> str | None:
    name = _pick(tools, "bash", "Bash", "run_shell_command", "exec_command", "shell")
    if name is None:
        return None
    params = tools[name]
    args: dict[str, Any] = {("cmd" if "cmd" in params else "command"): command}
    if "description" in params:
        args["description"] = why
    return _call(name, args)


def _read(tools: dict[str, set[str]], repo: str, file: str = "calc.py") -> str | None:
    name = _pick(tools, "read", "Read", "read_file")
    if name is None:
        return _shell(tools, f"cat {repo}/{file}", f"Show {file}")
    return _call(name, {_path_key(tools[name]): f"{repo}/{file}"})


def _edit(tools: dict[str, set[str]], repo: str, bug: str) -> str | None:
    buggy, fixed = BUGS[bug]
    name = _pick(tools, "edit", "Edit", "replace")
    if name is None:
        return _shell(tools, f"sed -i 's/{buggy}/{fixed}/' {repo}/calc.py", f"Fix {bug}")
    params = tools[name]
    path = {_path_key(params): f"{repo}/calc.py"}
    if "edits" in params:
        return _call(name, {**path, "edits": [{"oldText": buggy, "newText": fixed}]})
    if "oldString" in params:  # OpenCode
        return _call(name, {**path, "oldString": buggy, "newString": fixed})
    args: dict[str, Any] = {**path, "old_string": buggy, "new_string": fixed}
    if "instruction" in params:
        args["instruction"] = f"Make {bug} compute the right result."
    return _call(name, args)


def _side_answer(prompt: str) -> str:
    low = prompt.lower()
    if "managed memory extraction" in low:
        return "Nothing in this session is worth saving to memory."
    if "model_choice" in low or "router" in low:
        return json.dumps({"reasoning": "A small, well-scoped bug fix.", "model_choice": "flash"})
    if "title" in low:
        return json.dumps({"title": "Fix failing calc test"})
    return "A function in calc.py computes the wrong result."


def next_answer(prompt: str) -> str:
    """The scripted agent's next message (text, Hermes tool calls) for this rendered prompt."""
    segs = _segments(prompt)
    tools = _tools(prompt)
    start = None
    sub = False
    for i, (role, body) in enumerate(segs):
        if role == "user" and not body.startswith("\n<tool_response>"):
            if SUBTASK_MARKER in body:
                start, sub = i, True
            elif TASK_MARKER in body:
                start, sub = i, False
    if start is None:
        return _side_answer(prompt)
    m = re.search(r"Repository: (\S+)", segs[start][1])
    repo = m.group(1) if m else "."
    b = re.search(r"test_(add|mul|sub) fails", segs[start][1])
    bug = b.group(1) if b else "add"
    step = sum(body.count("<tool_call>") for role, body in segs[start + 1 :] if role == "assistant")
    if sub:
        if step == 0:
            return "Let me look at the module.\n" + (_read(tools, repo) or "")
        return f"calc.py defines {bug}(a, b) as `{BUGS[bug][0]}`: that line is the bug."
    plan: list[tuple[str, str | None]] = []
    if "Agent" in tools:
        agent_args = {
            "description": "Inspect calc module",
            "prompt": f"{SUBTASK_MARKER} Repository: {repo}\nRead calc.py and report what {bug}() does.",
            "subagent_type": "general-purpose",
        }
        plan.append(("I'll ask a sub-agent to inspect the module first.", _call("Agent", agent_args)))
    plan += [
        ("I'll read the code first.", _read(tools, repo)),
        ("And the tests.", _read(tools, repo, "test_calc.py")),
        ("Now let me run the tests.", _shell(tools, f"cd {repo} && python3 -m unittest -q", "Run the tests")),
        (f"{bug}() is wrong: `{BUGS[bug][0]}`. Fixing it.", _edit(tools, repo, bug)),
        ("Running the tests again.", _shell(tools, f"cd {repo} && python3 -m unittest -q", "Run the tests")),
        ("Let me review the change.", _shell(tools, f"cd {repo} && git diff --stat && git diff", "Show the diff")),
    ]
    if step < len(plan) and plan[step][1]:
        text, call = plan[step]
        return f"{text}\n{call}"
    if MINI_SUBMIT in prompt and step == len(plan):  # mini-swe-agent: every turn is a tool call, even the last
        return f"The fix is in and the tests pass. Submitting.\n{_shell(tools, f'echo {MINI_SUBMIT}', 'Submit')}"
    return f"Fixed: `{bug}` in calc.py now does `{BUGS[bug][1]}`, and the tests pass."


class ScriptedEngine(Engine):
    """``inference.engine.Engine`` with generation replaced by ``next_answer`` (same constructor, same handle API).

    ``context``: the context length the engine reports and enforces, when larger than the checkpoint's. The scripted
    "model" reads any prompt length, so recordings can use a real small model's tokenizer and chat template (e.g.
    SmolLM2-135M, 8192 positions) with harness prompts far longer than that model could serve.
    """

    context: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.context is not None:
            self.max_model_len = max(self.max_model_len, self.context)

    def start(self) -> None:  # no model thread: answers are produced in ``submit``
        return

    def stop(self, timeout: float = 10.0) -> None:
        return

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> GenerationHandle:
        if not prompt_ids:
            raise ValueError("the prompt must contain at least one token")
        if any(t < 0 or t >= len(self.tokenizer) for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {len(self.tokenizer)})")
        self.check_length(len(prompt_ids), params.max_tokens)
        handle = GenerationHandle(
            request_id=request_id or f"scripted-{next(self._ids)}",
            prompt_ids=list(prompt_ids),
            params=params,
            _loop=asyncio.get_running_loop(),
        )
        text = next_answer(self.tokenizer.decode(prompt_ids))
        im_end = self.tokenizer.token_id("<|im_end|>")
        ids = self.tokenizer.encode(text) + ([im_end] if im_end is not None else [])
        reason: Any = "stop"
        if len(ids) > params.max_tokens:
            ids, reason = ids[: params.max_tokens], "length"
        for pos, tid in enumerate(ids):
            lp = pseudo_logprob(len(prompt_ids), pos, tid)
            top = ((tid, lp),) if params.logprobs else ()
            handle._put(TokenEvent(tid, lp, top, self.version))
        self.stats["tokens"] += len(ids)
        handle._put(Finish(reason, None, self.version))
        return handle
