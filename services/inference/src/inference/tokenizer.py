"""A typed wrapper over the Hugging Face tokenizer of a checkpoint: the only calls the service makes.

Role: keep ``transformers``' loosely typed tokenizer API behind five small methods so the rest of the package is
mypy-clean and so every encode/decode follows one convention (no special tokens added on encode).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Tokenizer"]


class Tokenizer:
    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.vocab_size = len(hf)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return [int(i) for i in self.hf.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str) -> int | None:
        tid = self.hf.convert_tokens_to_ids(token)
        return None if tid is None or tid == self.hf.unk_token_id else int(tid)

    def token_strs(self, ids: list[int]) -> list[str]:
        return [str(t) for t in self.hf.convert_ids_to_tokens(ids)]

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any) -> str:
        text = self.hf.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
        return str(text)
