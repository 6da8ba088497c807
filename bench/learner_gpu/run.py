"""Learner GPU benchmark: training tokens/s and model FLOPs utilisation (MFU) of the real learner step, one GPU.

Builds a random-init Qwen2-style model of ~0.5B parameters (Qwen2.5-0.5B shapes: hidden 896, 24 layers, 14 heads,
2 KV heads, MLP 4864, vocab 151936, tied embeddings), saves it to a temp dir, and times ``learner.Learner.step``
(bf16 autocast, gradient checkpointing, fp32 AdamW master weights, the GRPO loss) on synthetic batches of
``--rows`` sequences of ``--seq-len`` tokens (half prompt, half trainable response).

Definitions (stated, so the numbers can be compared):
- tokens/s = all tokens fed through forward+backward (prompt + response, no padding) / wall-clock of ``step``;
- model FLOPs per token = 6 * N (N = parameters incl. the LM head, excluding the embedding lookup) + 12 * L * d * T
  (attention scores and values, PaLM appendix B; T = sequence length); recompute from gradient checkpointing and
  the KL reference forward (off here: ``--kl`` turns it on) are NOT counted, so this is MFU, not HFU;
- MFU = model FLOPs/s / peak dense bf16 FLOPs/s of the GPU (H100/H200 SXM 989 TFLOPs, A100 312; ``--peak-tflops``).

    python bench/learner_gpu/run.py                # one GPU, ~2-3 minutes including model creation
    python bench/learner_gpu/run.py --tiny --cpu   # smoke run of the script itself on a CPU
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

# trajectory_row is the learner tests' fixture (services/learner/tests/synthetic.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "services" / "learner" / "tests"))

from synthetic import trajectory_row

from contracts import to_ipc
from eventbus import configure_logging
from learner import Learner, LearnerSettings

PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}


def build_model(out: Path, tiny: bool) -> tuple[int, int, int, int]:
    """Save the random-init model; return (params without embedding lookup, layers, hidden, vocab)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if tiny:
        cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    else:
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() and not tiny else "cpu"):
        model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(str(out))
    total = sum(p.numel() for p in model.parameters())
    # Tied: the one embedding matrix is used as the LM head (a matmul, counted) and as a lookup (free).
    return total, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size


def batch(rows: int, seq_len: int, vocab: int, rng: random.Random) -> bytes:
    half = seq_len // 2
    out = []
    for i in range(rows):
        out.append(
            trajectory_row(
                session_id=f"s{i}", group_id=f"g{i // 8}", prompt=[rng.randrange(vocab) for _ in range(half)],
                response=[rng.randrange(vocab) for _ in range(seq_len - half)], response_mask=[1] * (seq_len - half),
                response_logprobs=[-rng.uniform(0.1, 5.0) for _ in range(seq_len - half)],
                response_versions=[0] * (seq_len - half), reward=float(i % 2), advantage=float(i % 2) - 0.5,
            )
        )  # fmt: skip
    return to_ipc(out, compression=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=4, help="measured steps (after one warm-up step)")
    parser.add_argument("--no-grad-ckpt", action="store_true")
    parser.add_argument("--kl", action="store_true", help="KL to a frozen reference (an extra forward, not counted)")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    configure_logging("bench-learner-gpu", level="WARNING")
    if args.tiny:
        args.rows, args.seq_len, args.steps = 4, 64, 1
    on_gpu = torch.cuda.is_available() and not args.cpu
    name = torch.cuda.get_device_name() if on_gpu else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)

    with tempfile.TemporaryDirectory(prefix="floe-bench-learner-gpu-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        n_params, layers, hidden, vocab = build_model(root / "model", args.tiny)
        build_s = time.perf_counter() - t0
        settings = LearnerSettings(
            model_dir=root / "model", checkpoint_dir=root / "ckpt", device="cuda" if on_gpu else "cpu",
            lr=1e-6, kl_coef=0.001 if args.kl else 0.0, micro_batch_tokens=args.micro_batch_tokens,
            gradient_checkpointing=not args.no_grad_ckpt and on_gpu, max_staleness=None,
        )  # fmt: skip
        learner = Learner(settings)
        rng = random.Random(0)
        data = [batch(args.rows, args.seq_len, vocab, rng) for _ in range(args.steps + 1)]
        learner.step("warmup", data[0])
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times, tokens = [], 0.0
        for i, d in enumerate(data[1:]):
            t = time.perf_counter()
            res = learner.step(f"b{i}", d)
            if on_gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            tokens += res.metrics["tokens_total"]
        t_ckpt = time.perf_counter()
        learner.save()
        ckpt_s = time.perf_counter() - t_ckpt

    step_s = sum(times) / len(times)
    tok_s = tokens / sum(times)
    flops_per_token = 6 * n_params + 12 * layers * hidden * args.seq_len
    achieved = tok_s * flops_per_token / 1e12
    mem = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
    rows = [
        ("device", name),
        ("model params (incl. tied LM head)", f"{n_params / 1e6:.1f} M"),
        ("batch", f"{args.rows} rows x {args.seq_len} tokens (half trainable)"),
        ("micro-batch tokens", f"{args.micro_batch_tokens}"),
        ("gradient checkpointing / KL reference", f"{settings.gradient_checkpointing} / {args.kl}"),
        ("model build + save", f"{build_s:.1f} s"),
        ("step time (mean of measured)", f"{step_s:.3f} s"),
        ("tokens/s (fwd+bwd, all tokens)", f"{tok_s:,.0f}"),
        ("model TFLOPs/s", f"{achieved:.1f}"),
        ("peak bf16 TFLOPs/s", f"{peak}" if peak else "unknown (--peak-tflops)"),
        ("MFU", f"{100 * achieved / peak:.1f} %" if peak else "n/a"),
        ("peak GPU memory", f"{mem:.1f} GiB"),
        ("checkpoint write (weights+optimizer)", f"{ckpt_s:.1f} s"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
