from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from contracts import TrajectoryBatch, decode, encode
from rollout.batching import BatchEncoder, batch_id_for, load_batch_table
from rollout.dataset import export_sft, iter_dataset, write_group
from rollout.groups import GroupAssembler, GroupResult

from .simulate import SessionPlan, simulate_group


def _groups(n: int, seed: int = 0) -> list[GroupResult]:
    a = GroupAssembler()
    rng = random.Random(seed)
    for g in range(n):
        for event in simulate_group(f"g{g}", [SessionPlan(reward=1.0), SessionPlan(reward=0.0)], rng):
            a.add(event)
    return [a.take(gid) for gid in a.ready_groups()]


def test_inline_batch_round_trips_through_the_wire_codec() -> None:
    groups = _groups(2)
    batch = BatchEncoder(builder="prefix_merging").encode(groups, step=3)
    assert batch.arrow_ipc is not None and batch.uri is None
    wire = decode(TrajectoryBatch, encode(batch))
    table = load_batch_table(wire)
    assert table.num_rows == batch.num_rows == sum(len(g.rows) for g in groups)
    assert table.column("group_id").to_pylist() == [row.group_id for g in groups for row in g.rows]
    assert batch.batch_id == batch_id_for("prefix_merging", ["g1", "g0"])
    assert batch.num_groups == 2 and batch.num_sessions == 4 and batch.step == 3
    assert batch.metrics["reconstruction.trainable_tokens"] > 0


def test_large_batch_goes_by_claim_check_with_checksum(tmp_path: Path) -> None:
    groups = _groups(3, seed=1)
    encoder = BatchEncoder(builder="prefix_merging", inline_max_bytes=100, claim_url=str(tmp_path / "claims"))
    batch = encoder.encode(groups, step=0)
    assert batch.arrow_ipc is None and batch.uri and batch.sha256
    data = Path(batch.uri).read_bytes()
    assert hashlib.sha256(data).hexdigest() == batch.sha256 == decode(TrajectoryBatch, encode(batch)).sha256
    assert load_batch_table(batch).num_rows == batch.num_rows
    # Same groups again: same id, same file, same bytes (content-addressed, idempotent).
    again = encoder.encode(groups, step=0)
    assert again == batch and len(list((tmp_path / "claims").iterdir())) == 1
    Path(batch.uri).write_bytes(data[:40] + bytes([data[40] ^ 0xFF]) + data[41:])
    with pytest.raises(ValueError, match="sha256"):
        load_batch_table(batch)


def test_same_groups_give_byte_identical_batches() -> None:
    one = BatchEncoder(builder="per_request").encode(_groups(2, seed=5), step=1)
    two = BatchEncoder(builder="per_request").encode(_groups(2, seed=5), step=1)
    assert encode(one) == encode(two)


def test_dataset_is_idempotent_per_group_and_exports_accepted_chat(tmp_path: Path) -> None:
    groups = _groups(2, seed=2)
    for g in groups:
        write_group(tmp_path, g)
        write_group(tmp_path, g)  # a rebuilt group overwrites, never duplicates
    rows = list(iter_dataset(tmp_path))
    assert len(rows) == sum(len(g.rows) for g in groups)
    out = tmp_path / "sft.jsonl"
    counts = export_sft(tmp_path, out, detokenize=lambda ids: " ".join(map(str, ids)))
    # Simulated calls record no canonical request, so nothing can be written as chat: counted, not invented.
    assert counts["written"] == 0 and counts["skipped_no_request"] > 0
    assert out.read_text() == ""


def test_export_writes_chat_messages_with_the_decoded_final_answer(tmp_path: Path) -> None:
    group = _groups(1, seed=4)[0]
    extras = group.extras
    for extra in extras:
        extra["request_json"] = json.dumps({"messages": [{"role": "user", "content": "fix it"}], "tools": [{"x": 1}]})
    write_group(tmp_path, group)
    out = tmp_path / "sft.jsonl"
    counts = export_sft(tmp_path, out, detokenize=lambda ids: f"<{len(ids)} tokens>")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    accepted = [r for r in group.rows if r.reward >= 1.0]
    assert counts["written"] == len(lines) == len(accepted) > 0
    assert lines[0]["messages"][0] == {"role": "user", "content": "fix it"}
    assert lines[0]["messages"][-1]["role"] == "assistant" and lines[0]["messages"][-1]["content"].endswith("tokens>")
    assert lines[0]["tools"] == [{"x": 1}] and lines[0]["reward"] == 1.0


def test_export_sft_cli_without_tokenizer_writes_token_ids(tmp_path: Path) -> None:
    from rollout.cli import main

    group = _groups(1, seed=6)[0]
    for extra in group.extras:
        extra["request_json"] = json.dumps({"system": "be brief", "messages": [{"role": "user", "content": "hi"}]})
    write_group(tmp_path / "ds", group)
    out = tmp_path / "sft.jsonl"
    assert main(["export", "sft", "--out", str(out), "--dataset", str(tmp_path / "ds")]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all(line["reward"] >= 1.0 for line in lines)
    first = lines[0]["messages"]
    assert first[0] == {"role": "system", "content": "be brief"} and first[-1]["content"] is None
    assert first[-1]["token_ids"]
