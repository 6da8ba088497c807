"""torchrun with 2 gloo processes (DDP and FSDP2) gives the same update as 1 process on the same data."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from contracts import to_ipc
from learner import LearnerSettings, train_files

from .synthetic import per_request_rows, synthetic_sessions

# lr 1 with Adam eps 1 makes the update linear in the gradient (see test_train), so comparing weights after two
# steps compares the gradients of both steps, including the second step's dependence on the first.
LINEAR = {"lr": 1.0, "adam_eps": 1.0, "weight_decay": 0.0, "kl_coef": 0.01, "micro_batch_tokens": 300}


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "layout"), [("ddp", "packed"), ("fsdp", "packed"), ("ddp", "padded")])
def test_two_process_gloo_run_matches_one_process(tiny_model_dir, tmp_path, strategy, layout):
    rng = random.Random(7)
    files = []
    for i in range(2):
        f = tmp_path / f"b{i}.arrow"
        f.write_bytes(to_ipc(per_request_rows(synthetic_sessions(2, 3, 2, rng))))
        files.append(f)

    one = LearnerSettings(
        model_dir=tiny_model_dir, checkpoint_dir=tmp_path / "one", micro_batch_layout=layout, **LINEAR
    )
    single = train_files(one, files)
    # An odd number of micro-batches: one rank also runs an empty one, so collectives must still match.
    assert all(int(r.metrics["micro_batches"]) % 2 == 1 for r in single), [r.metrics["micro_batches"] for r in single]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLOE_LEARNER_STRATEGY": strategy}
    env["FLOE_LEARNER_MICRO_BATCH_LAYOUT"] = layout
    env.update({f"FLOE_LEARNER_{k.upper()}": str(v) for k, v in LINEAR.items()})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "learner", "train-files", "--model-dir", str(tiny_model_dir), "--checkpoint-dir",
           str(tmp_path / "two"), *map(str, files)]  # fmt: skip
    # Own session, so a hang is killed with its worker processes (by our process group id), not left behind.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr[-4000:]
    assert '"world_size": 2' in stderr

    a = load_file(str(single[-1].checkpoint / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "v00000002" / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert not torch.equal(a[k], base[k]), f"{k} did not move"
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)


# A DDP model in a reference cycle (as the learner is), dropped, then shutdown(): the gloo group's threads must be
# gone before the interpreter exits, or finalization tears them down and a rank can abort at exit.
_SHUTDOWN_SCRIPT = """
import glob, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from learner.distributed import shutdown

def threads():
    return [open(f).read().strip() for f in glob.glob(f"/proc/{os.getpid()}/task/*/comm")]

store = dist.FileStore(sys.argv[1], 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
holder = {"model": DistributedDataParallel(torch.nn.Linear(2, 2))}
holder["self"] = holder
holder["model"](torch.ones(1, 2)).sum().backward()
assert any(t.startswith("pt_gloo") for t in threads()), threads()
del holder
shutdown()
print(sorted(t for t in threads() if "gloo" in t))
"""


def test_shutdown_frees_the_process_group_before_exit(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _SHUTDOWN_SCRIPT, str(tmp_path / "store")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "[]", proc.stdout
