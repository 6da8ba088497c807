"""Learner benchmark: training wall-clock on the same sessions built ``per_request`` vs ``prefix_merging``, on CPU.

The same synthetic multi-turn agent sessions (the learner tests' ``services/learner/tests/synthetic.py``: every call's
prompt extends the previous call's prompt + completion + tool output, as a real agent's does) are turned into the two
batch forms (docs/polar-comparison.md, "Per-request traces" / "Prefix merging") — one row per call with its full prompt,
or one merged row per session whose tool/template tokens are masked — and the real ``Learner.step`` trains on each (same
model, same settings, fresh checkpoint dir). Both forms carry exactly the same trainable tokens; per_request
re-processes every growing prefix.

Prints tokens processed, trainable tokens, wall-clock per step and the ratio. Default: a small Qwen2-style model
(hidden 128, 4 layers, vocab 512), 4 groups x 4 sessions x 8 turns, 3 measured steps per form after a warm-up.

    .venv/bin/python bench/learner/run.py [--turns 8] [--steps 3] [--threads 2] [--quick]

``--recordings DIR`` trains instead on recorded harness sessions (``bench/recordings``: real CLIs through the real
gateway): each session is rebuilt by ``rollout.builders`` (``per_request`` and ``prefix_merging``), turned into
``contracts.TrajectoryRow`` rows (advantage +1/-1 alternating by session, session_weight 1/num_traces), and the
learner trains on all selected sessions in one batch per form, once per micro-batch layout (``packed`` and
``padded``, ``learner.data``; their steps alternate, so a neighbour's load hits both alike). It prints s/step, CPU
seconds per thread, tokens/s and the padding fraction per form and layout, the packed / padded ratio and the
prefix_merging / per_request ratio, and writes the same figures with ``bench/report.py``
(``.floe/bench/learner.json``; ``packed_tokens_per_s``, ``padded_tokens_per_s``, ``packed_speedup`` are
prefix_merging's, the rollout's default). The model's vocabulary covers the recordings' ids (SmolLM2's tokenizer:
49152; the dev tokenizer's 2048 for older recordings). Default selection ``--harness pi --mode exact`` keeps the
run short on 2 shared cores (Codex's 16k and Claude Code's ~50k-token prompts make a per_request step take many
minutes on CPU; select them explicitly).

    .venv/bin/python bench/learner/run.py --recordings bench/recordings/data [--harness pi codex] [--mode exact]

``--real-model`` trains the real SmolLM2-135M-Instruct (``floe model fetch smollm2-135m``; or ``--model-dir DIR``, any
HF causal LM) on one micro-batch of ``--rows`` sequences x ``--seq-len`` tokens, whose ids are this repository's own
source code put through the model's tokenizer and chat template (half prompt, half trainable response). It prints
step time, tokens/s, the peak RSS of the measured steps (``VmHWM``, reset after loading and a warm-up step that
allocates the AdamW state) and the time and size of one checkpoint. One configuration per run, so that each peak
RSS is its own; the services/learner README has the numbers.

    .venv/bin/python bench/learner/run.py --real-model [--rows 8] [--seq-len 256] [--grad-ckpt] [--no-kl] [--bf16]

``--prompt-len N`` makes the first N tokens of each row the prompt (default half); the demo's shape is
``--rows 32 --seq-len 51 --prompt-len 45``. ``--all-positions`` computes the lm_head and log-softmax at every
position, as the learner did before it scored only the trained targets (``learner.model.target_logprobs``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, cast

import torch

# The synthetic sessions and tiny model are the learner tests' fixture (services/learner/tests/synthetic.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "services" / "learner" / "tests"))

from synthetic import per_request_rows, prefix_merging_rows, save_tiny_model, synthetic_sessions, trajectory_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/report.py: the figures as flat JSON
from report import write

from contracts import TrajectoryRow, to_ipc
from eventbus import configure_logging
from learner import Learner, LearnerSettings

RECORDED_VOCAB = 2048  # at least: the dev tokenizer's (``floe inference init-model``), which the first recordings used


def recorded_vocab(recs: dict[Any, list[list[Any]]]) -> int:
    """The tiny model's vocabulary for these recordings: every recorded id must embed (SmolLM2's reach 49152)."""
    top = max(
        max([*c.prompt_token_ids, *c.completion_token_ids], default=0) for v in recs.values() for s in v for c in s
    )
    return max(RECORDED_VOCAB, top + 1)


def recorded_rows(sessions: list[list[Any]], builder: str, harness: str) -> list[TrajectoryRow]:
    """Trajectory rows of recorded sessions rebuilt by ``rollout.builders`` (the rollout's own builders)."""
    from rollout.builders import build_trajectories

    rows: list[TrajectoryRow] = []
    for i, calls in enumerate(sessions):
        traces = build_trajectories(calls, builder).traces
        advantage = 1.0 if i % 2 == 0 else -1.0
        sid = calls[0].session_id
        for j, t in enumerate(traces):
            rows.append(
                TrajectoryRow(
                    session_id=sid,
                    group_id=f"{harness}-group",
                    task_id=f"{harness}-task",
                    harness=harness,
                    builder=builder,
                    trace_index=j,
                    num_traces=len(traces),
                    prompt_len=t.prompt_len,
                    tokens=t.tokens,
                    loss_mask=t.loss_mask,
                    logprobs=t.logprobs,
                    weight_versions=t.weight_versions,
                    reward=max(advantage, 0.0),
                    advantage=advantage,
                    session_weight=1.0 / len(traces),
                    status="DONE",
                )
            )
    return rows


def run_recorded(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recordings"))
    from load import load_recordings

    recs = load_recordings(args.recordings)
    chosen = {k: v for k, v in recs.items() if k[0] in args.harness and k[1] in args.mode}
    if not chosen:
        raise SystemExit(f"no recordings for harness {args.harness} / mode {args.mode} in {args.recordings}")
    vocab = recorded_vocab(chosen)
    batches = {
        form: to_ipc([row for (h, _m), sess in chosen.items() for row in recorded_rows(sess, form, h)])
        for form in ("per_request", "prefix_merging")
    }
    # Warm-up (allocator, kernels) on one small pi-sized row, so the measured steps compare the two forms only.
    first = next(iter(chosen.items()))
    warm = to_ipc(recorded_rows(first[1][:1], "prefix_merging", first[0][0])[:1])
    layouts = ("packed", "padded")
    results: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="floe-bench-learner-") as tmp:
        root = Path(tmp)
        model_dir = save_tiny_model(
            root / "model",
            vocab_size=vocab,
            num_heads=4,
            num_kv_heads=2,
            hidden_size=args.hidden,
            num_layers=args.layers,
            intermediate_size=3 * args.hidden,
        )
        for form, data in batches.items():
            learners = {}
            for layout in layouts:
                settings = LearnerSettings(
                    model_dir=model_dir,
                    checkpoint_dir=root / f"{form}-{layout}",
                    lr=1e-5,
                    kl_coef=0.0,
                    micro_batch_tokens=args.micro_batch_tokens,
                    max_seq_len=args.max_seq_len,
                    micro_batch_layout=cast(Literal["packed", "padded"], layout),
                )
                learners[layout] = Learner(settings)
                learners[layout].step(f"{form}-warmup", warm)
            runs: dict[str, list[dict[str, float]]] = {layout: [] for layout in layouts}
            for i in range(args.steps):
                # Layouts alternate step by step, so a neighbour's load on the shared machine hits both alike.
                for layout, learner in learners.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    res = learner.step(f"{form}-{i}", data)
                    runs[layout].append(
                        {**res.metrics, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
                    )
            for layout, steps in runs.items():
                results[form, layout] = {k: statistics.mean(m[k] for m in steps) for k in steps[0]}
    n_sessions = sum(len(v) for v in chosen.values())
    n_calls = sum(len(s) for v in chosen.values() for s in v)
    threads = torch.get_num_threads()
    print(f"\nlearner on recordings {sorted(chosen)}: {n_sessions} sessions, {n_calls} calls; model hidden "
          f"{args.hidden} x {args.layers} layers, vocab {vocab}; micro-batch tokens {args.micro_batch_tokens}; "
          f"{args.steps} step(s) each, CPU threads={threads}, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'form':<16}{'layout':<8}{'s/step':>9}{'CPU s/thr':>11}{'tokens/step':>13}{'trainable':>11}"
          f"{'micro-b.':>10}{'padding':>9}{'tokens/s':>10}")  # fmt: skip
    for (form, layout), r in results.items():
        print(f"{form:<16}{layout:<8}{r['wall_s']:>9.3f}{r['cpu_s'] / threads:>11.3f}{r['tokens_total']:>13.0f}"
              f"{r['tokens_trainable']:>11.0f}{r['micro_batches']:>10.1f}{r['padding_frac']:>9.1%}"
              f"{r['tokens_total'] / r['wall_s']:>10.0f}")  # fmt: skip
    figures: dict[str, float | int | str] = {
        "recordings": ",".join(f"{h}.{m}" for h, m in sorted(chosen)),
        "hidden": args.hidden,
        "layers": args.layers,
        "micro_batch_tokens": args.micro_batch_tokens,
        "steps": args.steps,
        "threads": threads,
    }
    for form in batches:
        pk, pd = results[form, "packed"], results[form, "padded"]
        speedup, cpu_speedup = pd["wall_s"] / pk["wall_s"], pd["cpu_s"] / pk["cpu_s"]
        print(f"{form}: packed / padded tokens/s {speedup:.2f}x (CPU time {cpu_speedup:.2f}x); padding in the "
              f"padded layout {pd['padding_frac']:.1%} of the positions computed; "
              f"loss {pk['loss']:.6g} vs {pd['loss']:.6g}")  # fmt: skip
        for layout, r in (("packed", pk), ("padded", pd)):
            figures[f"{form}_{layout}_tokens_per_s"] = r["tokens_total"] / r["wall_s"]
            figures[f"{form}_{layout}_s_per_step"] = r["wall_s"]
            figures[f"{form}_{layout}_cpu_s_per_step"] = r["cpu_s"]
            figures[f"{form}_{layout}_micro_batches"] = r["micro_batches"]
            figures[f"{form}_{layout}_padding_frac"] = r["padding_frac"]
        figures[f"{form}_packed_speedup"] = speedup
        figures[f"{form}_packed_cpu_speedup"] = cpu_speedup
        figures[f"{form}_tokens_per_step"] = pk["tokens_total"]
        figures[f"{form}_trainable_per_step"] = pk["tokens_trainable"]
    for layout in layouts:
        pr, pm = results["per_request", layout], results["prefix_merging", layout]
        print(f"prefix_merging speed-up ({layout}, wall-clock per step): {pr['wall_s'] / pm['wall_s']:.2f}x; "
              f"tokens processed: {pr['tokens_total'] / pm['tokens_total']:.2f}x fewer; same trainable tokens: "
              f"{pr['tokens_trainable'] == pm['tokens_trainable']}")  # fmt: skip
        figures[f"prefix_merging_speedup_{layout}"] = pr["wall_s"] / pm["wall_s"]
    figures["prefix_merging_tokens_ratio"] = (
        results["per_request", "packed"]["tokens_total"] / results["prefix_merging", "packed"]["tokens_total"]
    )
    # The headline figures: the rollout's default builder (prefix_merging).
    pk, pd = results["prefix_merging", "packed"], results["prefix_merging", "padded"]
    figures["packed_tokens_per_s"] = pk["tokens_total"] / pk["wall_s"]
    figures["padded_tokens_per_s"] = pd["tokens_total"] / pd["wall_s"]
    figures["packed_speedup"] = pd["wall_s"] / pk["wall_s"]
    figures["padded_padding_frac"] = pd["padding_frac"]
    write("learner", figures)


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def real_rows(model_dir: Path, rows: int, seq_len: int, prompt_len: int | None = None) -> list[TrajectoryRow]:
    """``rows`` sequences of exactly ``seq_len`` ids from the model's own tokenizer: chat-templated source code,
    the first ``prompt_len`` (default half) of them the prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    repo = Path(__file__).resolve().parents[2]
    corpus: list[int] = []
    for f in sorted((repo / "services").glob("*/src/*/*.py")):
        corpus += tok.encode(f.read_text())
        if len(corpus) > rows * seq_len:
            break
    half = seq_len // 2 if prompt_len is None else prompt_len
    eos = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else tok.eos_token_id
    out = []
    for i in range(rows):
        window = corpus[i * seq_len : (i + 1) * seq_len]
        text = str(tok.decode(window[: half // 2]))
        chat: Any = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = list(chat["input_ids"] if hasattr(chat, "keys") else chat)  # transformers 5 returns a mapping
        prompt = [*ids, *window[half // 2 : half]][:half]
        response = [*window[half : seq_len - 1], eos][: seq_len - len(prompt)]
        out.append(
            trajectory_row(
                session_id=f"s{i}", group_id=f"g{i // 4}", prompt=prompt, response=response,
                response_mask=[1] * len(response), response_logprobs=[-1.0] * len(response),
                response_versions=[0] * len(response), reward=float(i % 2), advantage=float(i % 2) - 0.5,
            )
        )  # fmt: skip
    return out


def run_real(args: argparse.Namespace) -> None:
    if args.model_dir is None:
        from inference.models import fetch_model
        from inference.settings import CacheSettings

        args.model_dir = fetch_model("smollm2-135m", CacheSettings().cache).path
    data = to_ipc(real_rows(args.model_dir, args.rows, args.seq_len, args.prompt_len))
    if args.all_positions:
        import functools

        from learner import model as learner_model
        from learner import train as learner_train

        # the trainer's own name for it is what a step calls
        learner_train.target_logprobs = functools.partial(  # type: ignore[attr-defined]
            learner_model.target_logprobs, all_positions=True
        )
    warm = to_ipc(real_rows(args.model_dir, 2, 32))
    with tempfile.TemporaryDirectory(prefix="floe-bench-learner-real-") as tmp:
        settings = LearnerSettings(
            model_dir=args.model_dir, checkpoint_dir=Path(tmp), lr=1e-6, kl_coef=0.0 if args.no_kl else 0.001,
            micro_batch_tokens=args.rows * args.seq_len, max_seq_len=args.seq_len, device="cpu",
            gradient_checkpointing=args.grad_ckpt, bf16=args.bf16, max_staleness=None,
        )  # fmt: skip
        t0 = time.perf_counter()
        learner = Learner(settings)
        load_s = time.perf_counter() - t0
        learner.step("warmup", warm)  # allocates the AdamW state: part of the steady state, not of a step
        rss_loaded = _proc_status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        times, cpu_times, tokens = [], [], 0.0
        for i in range(args.steps):
            t, c = time.perf_counter(), time.process_time()
            res = learner.step(f"b{i}", data)
            times.append(time.perf_counter() - t)
            cpu_times.append(time.process_time() - c)
            tokens += res.metrics["tokens_total"]
            assert res.metrics["finite"] == 1.0, res.metrics
        peak = _proc_status_kib("VmHWM")
        t = time.perf_counter()
        path = learner.save()
        save_s = time.perf_counter() - t
        assert path is not None
        weights = sum(p.stat().st_size for p in path.glob("*.safetensors"))
        optim = (path / "optimizer.pt").stat().st_size
    n_params = sum(p.numel() for p in learner.model.parameters())
    rows = [
        ("load average (1 min) at the end", f"{os.getloadavg()[0]:.1f}"),
        ("model", f"{args.model_dir} ({n_params / 1e6:.1f} M params)"),
        ("batch", f"{args.rows} rows x {args.seq_len} tokens ({args.prompt_len or 'half'} prompt), one micro-batch"),
        ("logits at", "every position" if args.all_positions else "trained targets only"),
        ("dtype / grad ckpt / KL ref", f"{'bf16 autocast' if learner.bf16 else 'fp32'} / {args.grad_ckpt} / "
                                       f"{not args.no_kl}"),
        ("CPU threads", f"{torch.get_num_threads()}"),
        ("load (policy + reference)", f"{load_s:.1f} s"),
        ("RSS after load + warm-up", f"{rss_loaded / 2**20:.2f} GiB"),
        ("peak RSS during steps", f"{peak / 2**20:.2f} GiB"),
        ("step time (mean of measured)", f"{statistics.mean(times):.1f} s ({len(times)} step(s))"),
        # On a shared machine wall-clock depends on the neighbours; CPU seconds / threads is what an idle one takes.
        ("step CPU time / threads", f"{statistics.mean(cpu_times) / torch.get_num_threads():.1f} s"),
        ("tokens/s (fwd+bwd, all tokens)", f"{tokens / sum(times):,.0f}"),
        ("checkpoint write", f"{save_s:.1f} s: weights {weights / 2**20:.0f} MiB + optimizer {optim / 2**20:.0f} MiB"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="measured steps per form (3; 1 with --recordings)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="tiny model and 4 turns, for a smoke run")
    parser.add_argument("--recordings", type=Path, help="train on recorded sessions in DIR (bench/recordings/data)")
    parser.add_argument("--harness", nargs="+", default=["pi"], help="with --recordings")
    parser.add_argument(
        "--mode", nargs="+", default=["exact"], choices=["exact", "canonical"], help="with --recordings"
    )
    parser.add_argument("--hidden", type=int, default=128, help="with --recordings: model width")
    parser.add_argument("--layers", type=int, default=4, help="with --recordings: model depth")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768, help="with --recordings")
    parser.add_argument("--max-seq-len", type=int, default=65536, help="with --recordings")
    parser.add_argument("--real-model", action="store_true", help="train SmolLM2-135M (or --model-dir) instead")
    parser.add_argument("--model-dir", type=Path, default=None, help="with --real-model: an HF causal LM directory")
    parser.add_argument("--rows", type=int, default=8, help="with --real-model")
    parser.add_argument("--seq-len", type=int, default=256, help="with --real-model")
    parser.add_argument("--prompt-len", type=int, default=None, help="with --real-model: prompt tokens per row")
    parser.add_argument("--all-positions", action="store_true", help="with --real-model: logits at every position")
    parser.add_argument("--grad-ckpt", action="store_true", help="with --real-model: gradient checkpointing")
    parser.add_argument("--no-kl", action="store_true", help="with --real-model: no KL reference forward")
    parser.add_argument("--bf16", action="store_true", help="with --real-model: bf16 autocast on the CPU")
    args = parser.parse_args()
    configure_logging("bench-learner", level="WARNING")
    torch.set_num_threads(args.threads)
    if args.real_model:
        args.steps = args.steps or 1
        run_real(args)
        return
    if args.recordings:
        args.steps = args.steps or 1
        if args.quick:
            args.steps, args.hidden, args.layers, args.harness = 1, 32, 2, ["pi"]
        run_recorded(args)
        return
    args.steps = args.steps or 3
    if args.quick:
        args.turns, args.steps, args.groups = 4, 1, 2
    vocab = 512
    with tempfile.TemporaryDirectory(prefix="floe-bench-learner-") as tmp:
        root = Path(tmp)
        size = (
            dict(hidden_size=32, num_layers=2, intermediate_size=64)
            if args.quick
            else dict(hidden_size=128, num_layers=4, intermediate_size=384)
        )
        model_dir = save_tiny_model(root / "model", vocab_size=vocab, num_heads=4, num_kv_heads=2, **size)
        rng = random.Random(0)
        sessions = [
            synthetic_sessions(args.groups, args.group_size, args.turns, rng, vocab_size=vocab)
            for _ in range(args.steps + 1)
        ]
        results = {}
        for form, build in (("per_request", per_request_rows), ("prefix_merging", prefix_merging_rows)):
            settings = LearnerSettings(
                model_dir=model_dir, checkpoint_dir=root / form, lr=1e-5, kl_coef=0.0, micro_batch_tokens=8192
            )
            learner = Learner(settings)
            batches = [to_ipc(build(s)) for s in sessions]
            learner.step(f"{form}-warmup", batches[0])
            times, tokens, trainable, mbs = [], 0.0, 0.0, 0.0
            for i, data in enumerate(batches[1:]):
                t0 = time.perf_counter()
                res = learner.step(f"{form}-{i}", data)
                times.append(time.perf_counter() - t0)
                tokens += res.metrics["tokens_total"]
                trainable += res.metrics["tokens_trainable"]
                mbs += res.metrics["micro_batches"]
            results[form] = (statistics.mean(times), tokens / len(times), trainable / len(times), mbs / len(times))

    pr, pm = results["per_request"], results["prefix_merging"]
    print(f"\nlearner: {args.groups} groups x {args.group_size} sessions x {args.turns} turns, "
          f"{args.steps} step(s), CPU threads={args.threads}")  # fmt: skip
    print(f"{'form':<16}{'s/step':>10}{'tokens/step':>14}{'trainable':>12}{'micro-b.':>10}{'tokens/s':>12}")
    for form, (t, tok, tr, mb) in results.items():
        print(f"{form:<16}{t:>10.3f}{tok:>14.0f}{tr:>12.0f}{mb:>10.1f}{tok / t:>12.0f}")
    print(f"prefix_merging speed-up (wall-clock per step): {pr[0] / pm[0]:.2f}x; "
          f"tokens processed: {pr[1] / pm[1]:.2f}x fewer; same trainable tokens: {pr[2] == pm[2]}")  # fmt: skip


if __name__ == "__main__":
    main()
