"""The on-disk trajectory dataset (Parquet) and its export to chat-format JSONL for supervised fine-tuning.

Every published group is also written to ``<dataset_dir>/<group_id>.parquet`` (temporary name, then rename). The file
name is the group id, so rebuilding a group after a crash overwrites the same file with the same rows: the dataset
never holds a trajectory twice. Columns: ``TRAJECTORY_SCHEMA`` plus ``request_json`` (the canonical request of the
trace's last call, as the gateway recorded it, or null when it was not recorded or truncated) and
``final_completion`` (that call's sampled ids), which the SFT export needs to write chat messages.

``export_sft`` writes one JSON line per *accepted* trace (trainable, ``DONE``, reward ≥ ``min_reward``):
``{"messages": [...request messages..., {"role": "assistant", "content": <decoded final answer>}], "tools": ...,
"trajectory_id", "session_id", "task_id", "harness", "reward"}``. Decoding the final answer needs the policy's
tokenizer (``detokenize``); without one the assistant message carries ``"token_ids"`` instead of text. Traces whose
request was not recorded are counted as skipped, never invented.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from contracts import TRAJECTORY_SCHEMA, trajectory_table
from rollout.groups import GroupResult

__all__ = ["DATASET_SCHEMA", "ExportCounts", "export_sft", "iter_dataset", "write_group"]

DATASET_SCHEMA = pa.schema(
    [
        *TRAJECTORY_SCHEMA,
        pa.field("request_json", pa.string(), nullable=True),
        pa.field("final_completion", pa.list_(pa.int32()), nullable=False),
    ],
    metadata=TRAJECTORY_SCHEMA.metadata,
)


def write_group(dataset_dir: str | Path, group: GroupResult) -> Path:
    root = Path(dataset_dir)
    root.mkdir(parents=True, exist_ok=True)
    extras = group.extras
    table = trajectory_table(group.rows)
    for name in ("request_json", "final_completion"):
        field = DATASET_SCHEMA.field(name)
        table = table.append_column(field, pa.array([e[name] for e in extras], type=field.type))
    path = root / f"{group.group_id}.parquet"
    tmp = root / f".{group.group_id}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def iter_dataset(dataset_dir: str | Path) -> Iterator[dict[str, Any]]:
    for path in sorted(Path(dataset_dir).glob("*.parquet")):
        yield from pq.read_table(path, schema=DATASET_SCHEMA).to_pylist()


class ExportCounts(dict[str, int]):
    """written / skipped_not_accepted / skipped_no_request."""


def export_sft(
    dataset_dir: str | Path,
    out: str | Path,
    *,
    min_reward: float = 1.0,
    detokenize: Callable[[Sequence[int]], str] | None = None,
) -> ExportCounts:
    counts = ExportCounts(written=0, skipped_not_accepted=0, skipped_no_request=0)
    with open(out, "w", encoding="utf-8") as fh:
        for row in iter_dataset(dataset_dir):
            if row["masked_reason"] is not None or row["status"] != "DONE" or row["reward"] < min_reward:
                counts["skipped_not_accepted"] += 1
                continue
            request = json.loads(row["request_json"]) if row["request_json"] else None
            messages = _messages(request) if isinstance(request, dict) else None
            if messages is None:
                counts["skipped_no_request"] += 1
                continue
            answer: dict[str, Any] = {"role": "assistant"}
            if detokenize is not None:
                answer["content"] = detokenize(row["final_completion"])
            else:
                answer["content"] = None
                answer["token_ids"] = row["final_completion"]
            record: dict[str, Any] = {"messages": [*messages, answer]}
            if isinstance(request, dict) and request.get("tools"):
                record["tools"] = request["tools"]
            record.update(
                trajectory_id=row["trajectory_id"],
                session_id=row["session_id"],
                task_id=row["task_id"],
                harness=row["harness"],
                reward=row["reward"],
            )
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            counts["written"] += 1
    return counts


def _messages(request: dict[str, Any]) -> list[dict[str, Any]] | None:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    system = request.get("system")
    if isinstance(system, str) and system:
        return [{"role": "system", "content": system}, *messages]
    return list(messages)
