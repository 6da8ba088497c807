"""Arrow -> tensors: decoding, zero copy, claim checks, filtering, weighting and packing."""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import pytest
import torch

import contracts
from contracts import TrajectoryBatch, read_ipc, to_ipc
from learner.data import BatchError, batch_payload, decode_sequences, microbatches, pack, prepare

from .synthetic import per_request_rows, prefix_merging_rows, synthetic_sessions, trajectory_row


def rows_fixture(seed: int = 0, groups: int = 2, size: int = 3, turns: int = 3):
    return per_request_rows(synthetic_sessions(groups, size, turns, random.Random(seed)))


def test_decode_matches_rows_and_is_zero_copy():
    rows = rows_fixture()
    data = to_ipc(rows, compression=None)
    table = read_ipc(data)
    seqs = decode_sequences(table, "b1")
    assert seqs.num_rows == len(rows)
    for r, row in enumerate(rows):
        lo, hi = int(seqs.offsets[r]), int(seqs.offsets[r + 1])
        assert seqs.tokens[lo:hi].tolist() == list(row.tokens)
        assert seqs.loss_mask[lo:hi].tolist() == list(row.loss_mask)
        assert seqs.weight_versions[lo:hi].tolist() == list(row.weight_versions)
        torch.testing.assert_close(seqs.logprobs[lo:hi], torch.tensor(row.logprobs, dtype=torch.float32))
        assert seqs.advantage[r].item() == pytest.approx(row.advantage)
        assert seqs.prompt_len[r].item() == row.prompt_len
    # Zero copy: the token tensor points into Arrow's value buffer, not at a copy.
    buf = table.column("tokens").chunk(0).values.buffers()[1]
    assert buf.address <= seqs.tokens.data_ptr() < buf.address + buf.size
    lp_buf = table.column("logprobs").chunk(0).values.buffers()[1]
    assert lp_buf.address <= seqs.logprobs.data_ptr() < lp_buf.address + lp_buf.size
    # Sessions and groups become dense indices in order of appearance.
    assert seqs.session_index.tolist()[:4] == [0, 0, 0, 1]


def test_inline_and_claim_check_payloads(tmp_path):
    data = to_ipc(rows_fixture())
    inline = contracts.decode(
        TrajectoryBatch,
        contracts.encode(
            TrajectoryBatch(
                batch_id="b",
                step=0,
                num_rows=1,
                num_groups=1,
                num_sessions=1,
                builder="per_request",
                min_weight_version=0,
                max_weight_version=0,
                size_bytes=len(data),
                arrow_ipc=data,
            )
        ),
    )
    assert isinstance(batch_payload(inline), memoryview)  # the Kafka message itself, not a copy
    assert decode_sequences(batch_payload(inline)).num_rows == 18

    path = tmp_path / "b.arrow"
    path.write_bytes(data)
    common = dict(
        batch_id="b",
        step=0,
        num_rows=18,
        num_groups=2,
        num_sessions=6,
        builder="per_request",
        min_weight_version=0,
        max_weight_version=0,
        size_bytes=len(data),
    )
    ok = TrajectoryBatch(**common, uri=path.as_uri(), sha256=hashlib.sha256(data).hexdigest())
    assert bytes(batch_payload(ok)) == data
    plain = TrajectoryBatch(**common, uri=str(path), sha256=hashlib.sha256(data).hexdigest())
    assert bytes(batch_payload(plain)) == data
    with pytest.raises(BatchError, match="sha256 mismatch"):
        batch_payload(TrajectoryBatch(**common, uri=path.as_uri(), sha256="0" * 64))
    with pytest.raises(BatchError, match="cannot read"):
        batch_payload(TrajectoryBatch(**common, uri=(tmp_path / "missing").as_uri(), sha256="0" * 64))
    with pytest.raises(BatchError, match="unsupported claim-check scheme"):
        batch_payload(TrajectoryBatch(**common, uri="s3://bucket/b.arrow", sha256="0" * 64))


def test_garbage_payload_is_a_decode_error():
    with pytest.raises(contracts.DecodeError):
        decode_sequences(b"not arrow at all")


def test_pack_respects_budget_and_covers_every_item_once():
    rng = random.Random(1)
    lengths = [rng.randint(1, 300) for _ in range(200)]
    groups = pack(lengths, token_budget=1024)
    assert sorted(i for g in groups for i in g) == list(range(200))
    for g in groups:
        padded = len(g) * max(lengths[i] for i in g)
        assert padded <= 1024 or len(g) == 1
    assert pack([5000, 10], 1024) == [[0], [1]]  # an overlong item gets a micro-batch alone


def test_packed_grouping_fills_micro_batches_to_the_budget():
    rng = random.Random(1)
    lengths = [rng.randint(1, 300) for _ in range(200)]
    groups = pack(lengths, token_budget=1024, layout="packed")
    assert sorted(i for g in groups for i in g) == list(range(200))
    sums = [sum(lengths[i] for i in g) for g in groups]
    assert max(sums) <= 1024
    # First-fit decreasing: no two micro-batches could be merged, and it needs at most a few more than the bound.
    assert all(a + b > 1024 for i, a in enumerate(sums) for b in sums[i + 1 :])
    assert len(groups) <= -(-sum(lengths) // 1024) + 1
    assert len(groups) < len(pack(lengths, token_budget=1024, layout="padded"))
    assert pack([5000, 10, 20], 1024, layout="packed") == [[0], [2, 1]]


def test_microbatches_align_targets_and_weights_sum_to_one_across_ranks():
    rows = rows_fixture(seed=2)
    seqs = decode_sequences(to_ipc(rows))
    batch = prepare(seqs, current_version=0, max_staleness=3, agg="token-mean", max_seq_len=10_000)
    all_mbs = [microbatches(batch, 512, rank, 3, layout="padded") for rank in range(3)]
    assert len({len(m) for m in all_mbs}) == 1, "every rank gets the same number of micro-batches"
    total_weight = sum(float(mb.weights.sum()) for mbs in all_mbs for mb in mbs)
    assert total_weight == pytest.approx(1.0, abs=1e-5)
    trainable = sum(int(mb.mask.sum()) for mbs in all_mbs for mb in mbs)
    assert trainable == sum(sum(r.loss_mask) for r in rows)
    # Each target position carries the logprob of the *next* input token.
    by_tokens = {r.tokens: r for r in rows}
    for mbs in all_mbs:
        for mb in mbs:
            for b in range(mb.input_ids.shape[0]):
                assert mb.attention_mask is not None
                n = int(mb.attention_mask[b].sum())
                if n == 0 or mb.weights[b].sum() == 0:
                    continue
                row = by_tokens[tuple(mb.input_ids[b, :n].tolist())]
                assert mb.mask[b, : n - 1].tolist() == [bool(x) for x in row.loss_mask[1:]]
                torch.testing.assert_close(mb.behav_logprobs[b, : n - 1], torch.tensor(row.logprobs[1:]))
                assert torch.all(mb.advantages[b] == row.advantage)
                assert not mb.mask[b, n - 1 :].any(), "padding is never trainable"


def test_prepare_truncates_to_causal_prefix_and_drops_overlong_prompts():
    row = trajectory_row(
        session_id="s",
        group_id="g",
        prompt=[3] * 6,
        response=[4] * 10,
        response_mask=[1] * 10,
        response_logprobs=[-1.0] * 10,
        response_versions=[0] * 10,
        reward=1.0,
        advantage=1.0,
    )
    long_prompt = replace(row, session_id="t", prompt_len=12, loss_mask=(0,) * 12 + (1,) * 4)
    seqs = decode_sequences(to_ipc([row, long_prompt]))
    batch = prepare(seqs, 0, None, "token-mean", max_seq_len=10)
    assert batch.rows == [0]
    assert batch.lengths == [10]
    assert batch.stats["tokens_trainable"] == 4  # positions 6..9
    assert batch.stats["tokens_dropped_overlong"] == 6 + 4
    assert batch.stats["rows_dropped_prompt_overlong"] == 1


def test_prepare_never_trains_prompt_tokens_even_if_flagged():
    row = trajectory_row(
        session_id="s",
        group_id="g",
        prompt=[3] * 4,
        response=[4] * 3,
        response_mask=[1] * 3,
        response_logprobs=[-1.0] * 3,
        response_versions=[0] * 3,
        reward=1.0,
        advantage=1.0,
    )
    row = replace(row, loss_mask=(1,) * 7, weight_versions=(0,) * 7)
    batch = prepare(decode_sequences(to_ipc([row])), 0, None, "token-mean", max_seq_len=100)
    assert batch.trainable.tolist() == [False] * 4 + [True] * 3
    assert batch.stats["tokens_dropped_in_prompt"] == 4


def test_staleness_in_prepare_counts_and_all_stale_batch_has_no_rows():
    sessions = synthetic_sessions(1, 2, 2, random.Random(0), version=2)
    rows = prefix_merging_rows(sessions)
    seqs = decode_sequences(to_ipc(rows))
    fresh = prepare(seqs, current_version=5, max_staleness=3, agg="session-mean", max_seq_len=10_000)
    assert fresh.stats["tokens_dropped_stale"] == 0 and fresh.rows == [0, 1]
    stale = prepare(seqs, current_version=6, max_staleness=3, agg="session-mean", max_seq_len=10_000)
    assert stale.rows == []
    assert stale.stats["tokens_dropped_stale"] == sum(sum(r.loss_mask) for r in rows)
