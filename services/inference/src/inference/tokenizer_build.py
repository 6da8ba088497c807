"""Build floe's development tokenizer: a deterministic byte-level BPE trained on a corpus generated here.

Role: our machines cannot download tokenizers, so the dev model's tokenizer is trained locally, in about a second, from
a synthetic corpus (English prose, Python, shell, JSON and ChatML/tool-call snippets) produced by a seeded generator.
Byte-level BPE means any UTF-8 text encodes losslessly, whatever the corpus covered.

Limits: the corpus is small, so common code and prose compress reasonably but rare scripts fall back to bytes.
Determinism: the same ``seed`` and ``vocab_size`` give byte-identical ``tokenizer.json`` files (tested).
"""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from inference.chat_template import CHAT_TEMPLATE

__all__ = [
    "CONTROL_TOKENS",
    "EOS_TOKEN",
    "MARKER_TOKENS",
    "PAD_TOKEN",
    "build_tokenizer",
    "generate_corpus",
]

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
# Special (skipped when decoding output text): the ChatML frame.
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added but NOT special, as in Qwen: they survive detokenisation so parsers (and users) can see them.
MARKER_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>")

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "file",
    "code",
    "test",
    "run",
    "build",
    "error",
    "value",
    "list",
    "read",
    "line",
    "function",
    "return",
    "class",
    "import",
    "print",
    "string",
    "data",
    "model",
    "token",
    "request",
    "response",
    "server",
    "client",
    "agent",
    "tool",
    "call",
    "result",
    "output",
    "input",
    "task",
    "repository",
    "commit",
    "branch",
    "patch",
    "fix",
    "bug",
    "issue",
    "please",
    "help",
    "check",
    "open",
    "close",
    "create",
    "delete",
    "update",
    "change",
    "add",
    "remove",
    "install",
    "configure",
    "path",
    "directory",
    "version",
]
_PY = (
    "def {f}({a}):\n    return {a} + 1\n",
    "import os\nimport sys\n\nfor {a} in range(10):\n    print({a})\n",
    "class {F}:\n    def __init__(self, {a}: int) -> None:\n        self.{a} = {a}\n",
    'if {a} is None:\n    raise ValueError("{a} must be set")\n',
    'with open("{f}.txt") as fh:\n    {a} = fh.read().splitlines()\n',
    'try:\n    {f}()\nexcept Exception as exc:\n    log.error("failed", error=str(exc))\n',
)
_SHELL = (
    "$ ls -la {f}/\n",
    "$ git diff HEAD~1 -- {f}.py\n",
    "$ python -m pytest tests/test_{f}.py -q\n",
    "$ cat {f}.json | jq .{a}\n",
    '$ grep -rn "{a}" src/\n',
    "Process exited with code 0\n",
)


def _json_snippet(rng: random.Random) -> str:
    a, b = rng.choice(_WORDS), rng.choice(_WORDS)
    return f'{{"name": "{a}_{b}", "arguments": {{"{a}": "{b}", "count": {rng.randint(0, 999)}}}}}'


def generate_corpus(seed: int = 0, lines: int = 6000) -> list[str]:
    """A deterministic training corpus: prose, code, shell, JSON and ChatML-framed turns."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        kind = i % 6
        f, a = rng.choice(_WORDS), rng.choice(_WORDS)
        if kind == 0:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 20))]
            out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind == 1:
            out.append(rng.choice(_PY).format(f=f, F=f.capitalize(), a=a))
        elif kind == 2:
            out.append(rng.choice(_SHELL).format(f=f, a=a))
        elif kind == 3:
            out.append("<tool_call>\n" + _json_snippet(rng) + "\n</tool_call>")
        elif kind == 4:
            out.append(
                f"<|im_start|>user\nPlease {f} the {a}.<|im_end|>\n"
                f"<|im_start|>assistant\n<think>\nI should {a}.\n</think>\n\n"
            )
        else:
            # Digits, punctuation and mixed case so numbers and symbols get merges too.
            out.append(f"{a.upper()}_{rng.randint(0, 10**6)} = [{rng.random():.4f}, {rng.randint(-99, 99)}]  # {f}")
    return out


def build_tokenizer(out_dir: Path, *, vocab_size: int = 2048, seed: int = 0) -> PreTrainedTokenizerFast:
    """Train the BPE and save it in Hugging Face format (``AutoTokenizer.from_pretrained(out_dir)`` loads it)."""
    specials = [*CONTROL_TOKENS, *MARKER_TOKENS]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(generate_corpus(seed), trainer=trainer)
    # Re-register with the right flags: ChatML frame tokens are special, the tags are plain added tokens.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast
