#!/usr/bin/env python3
"""floe's toy agent: the smallest honest "harness" for the demo's toy verifiable tasks.

An ordinary OpenAI Chat client, configured only through the standard ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``
variables exactly like any harness pointed at floe's gateway: it reads the task text, asks the model once over HTTP,
and writes the reply to ``answer.txt`` in the workspace. The session runner collects that as the diff and the scorer
grades it with the ``answer`` evaluator. There is no special API: the gateway records the call at token level like
any other.

Two clients, the same request on the wire (``FLOE_TOY_CLIENT``):

- ``openai`` (default, preset ``toy``, the demo's): the official ``openai`` SDK. Importing it costs ~0.5 s of CPU
  per session, the largest stage of a demo session on 2 cores (bench/session_rate).
- ``stdlib`` (preset ``toy-stdlib``): ``urllib`` from the standard library. Starts in ~40 ms of CPU: 4.7x the
  sessions per second. Not the demo's default yet: with it, sessions end inside the fault-tolerance test's broker
  outage and are lost until their group deadline (docs/scaling.md).

Usage: floe-toy-agent PROMPT_FILE
  (env: OPENAI_BASE_URL, OPENAI_API_KEY, FLOE_MODEL, FLOE_TOY_MAX_TOKENS, FLOE_TOY_CLIENT)
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

RETRIES = 2  # as the SDK's max_retries: connection errors, 408, 409, 429 and 5xx are retried
TIMEOUT_S = 120.0


def ask_stdlib(prompt: str, model: str, max_tokens: int) -> tuple[str, str]:
    url = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/") + "/chat/completions"
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"}
    for attempt in range(RETRIES + 1):
        request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
                reply = json.loads(resp.read())
            choice = reply["choices"][0]
            return choice["message"].get("content") or "", str(choice.get("finish_reason"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            if (exc.code not in (408, 409, 429) and exc.code < 500) or attempt == RETRIES:
                raise SystemExit(f"error: HTTP {exc.code} from {url}: {detail}") from None
            print(f"retrying after HTTP {exc.code}: {detail[:200]}", file=sys.stderr)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if attempt == RETRIES:
                raise SystemExit(f"error: cannot reach {url}: {exc}") from None
            print(f"retrying after a connection error: {exc}", file=sys.stderr)
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def ask_openai(prompt: str, model: str, max_tokens: int) -> tuple[str, str]:
    from openai import OpenAI

    client = OpenAI(max_retries=RETRIES, timeout=TIMEOUT_S)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
    )
    return reply.choices[0].message.content or "", str(reply.choices[0].finish_reason)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    prompt = Path(sys.argv[1]).read_text()
    client = os.environ.get("FLOE_TOY_CLIENT", "openai")
    ask = {"stdlib": ask_stdlib, "openai": ask_openai}.get(client)
    if ask is None:
        print(f"error: FLOE_TOY_CLIENT must be stdlib or openai, not {client!r}", file=sys.stderr)
        return 2
    answer, finish = ask(
        prompt, os.environ.get("FLOE_MODEL", "policy"), int(os.environ.get("FLOE_TOY_MAX_TOKENS", "8"))
    )
    Path("answer.txt").write_text(answer.strip() + "\n")
    print(f"answer: {answer.strip()!r} ({finish})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
