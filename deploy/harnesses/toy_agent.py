#!/usr/bin/env python3
"""floe's toy agent: the smallest honest "harness" for the demo's toy verifiable tasks.

It is an ordinary OpenAI client — the official ``openai`` SDK, configured only through the standard
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` variables, exactly like any harness pointed at floe's gateway — that reads
the task text, asks the model once, and writes the reply to ``answer.txt`` in the workspace. The session runner
collects that as the diff and the scorer grades it with the ``answer`` evaluator. There is no special API: the
gateway records the call at token level like any other.

Usage: floe-toy-agent PROMPT_FILE   (env: OPENAI_BASE_URL, OPENAI_API_KEY, FLOE_MODEL, FLOE_TOY_MAX_TOKENS)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from openai import OpenAI


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    prompt = Path(sys.argv[1]).read_text()
    client = OpenAI(max_retries=2, timeout=120)
    reply = client.chat.completions.create(
        model=os.environ.get("FLOE_MODEL", "policy"),
        messages=[{"role": "user", "content": prompt}],
        max_tokens=int(os.environ.get("FLOE_TOY_MAX_TOKENS", "8")),
    )
    answer = reply.choices[0].message.content or ""
    Path("answer.txt").write_text(answer.strip() + "\n")
    print(f"answer: {answer.strip()!r} ({reply.choices[0].finish_reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
