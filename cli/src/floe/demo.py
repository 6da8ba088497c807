"""``floe demo``: the main job on the embedded default — every service as its own process over a real Kafka broker.

What it runs (each a separate process, logs in ``<run>/logs/``):

- a fresh single-node Kafka broker (``deploy/kafka/kafka.sh``) on free ports, state in ``<run>/kafka``;
- ``inference``: the CPU engine serving the tiny dev model (created in ``<run>/model``), hot-reloading weights;
- ``gateway``: the model-API proxy + session runner (harnesses in bubblewrap sandboxes);
- ``scorer``: grades each session (``answer`` evaluator for the toy tasks, SWE-bench rules for ``--workload swe``);
- ``rollout``: schedules GRPO groups, rebuilds trajectories, publishes Arrow batches;
- ``learner``: GRPO steps, checkpoints, ``WeightsPublished``;
- ``dashboard``: the live web page.

Default workload (``toy``): one-digit arithmetic questions answered by the toy agent (the official ``openai`` SDK
against the gateway, one call) and graded with partial credit for digits, so the tiny random model visibly learns
within minutes. ``--workload swe --harness pi`` runs the bundled SWE tasks with a real harness instead: the pipeline
runs end to end, but a tiny random model is not expected to learn to fix bugs.

The demo itself only watches the topics (its own consumer group): per training step it prints one status line; at
the end it writes ``<run>/report/`` (reward-per-step PNG, config, summary) and stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts import TOPICS, TRAJECTORY_BATCHES, WEIGHTS, Topic, TrajectoryBatch, WeightsPublished, read_ipc
from eventbus import Consumer, EventBusError, KafkaSettings, Message, ensure_topics_sync
from eventbus.broker import BrokerError, LocalBroker, free_port
from floe.home import state_home
from floe.report import StepRecord, summarize, write_report
from floe.stack import ServiceSpec, Stack, StackError, python_module

__all__ = ["DemoConfig", "add_parser", "run"]


@dataclass
class DemoConfig:
    steps: int = 20
    workload: str = "toy"
    harness: str = "toy"
    group_size: int = 8
    groups_per_step: int = 2
    lr: float = 2e-2
    max_tokens: int = 8
    temperature: float = 1.0
    max_off_policy_steps: int = 2
    builder: str = "prefix_merging"
    timeout_s: float = 1800.0
    seed: int = 0
    dashboard: bool = True
    run_dir: Path = field(default_factory=lambda: Path("."))

    @property
    def task_source(self) -> str:
        return "toy" if self.workload == "toy" else "bundled"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="the main job: every service over a local Kafka, GRPO steps, a report")
    d = DemoConfig()
    p.add_argument("--steps", type=int, default=d.steps, help="GRPO steps (trajectory batches) to train")
    p.add_argument(
        "--workload",
        choices=["toy", "swe"],
        default=d.workload,
        help="toy: arithmetic the tiny model can learn; swe: bundled SWE tasks with a real harness",
    )
    p.add_argument("--harness", default=None, help="harness preset (default: toy for toy, pi for swe)")
    p.add_argument("--group-size", type=int, default=d.group_size, help="sessions per GRPO group (G)")
    p.add_argument("--groups-per-step", type=int, default=d.groups_per_step)
    p.add_argument("--lr", type=float, default=d.lr, help="learner learning rate (tiny model: large)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="toy agent: tokens per answer")
    p.add_argument("--builder", choices=["prefix_merging", "per_request"], default=d.builder)
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="give up after this many seconds")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--run-dir", default=None, help="default: <state home>/runs/<timestamp>")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload = args.workload
    cfg = DemoConfig(
        steps=args.steps,
        workload=workload,
        harness=args.harness or ("toy" if workload == "toy" else "pi"),
        group_size=args.group_size,
        groups_per_step=args.groups_per_step,
        lr=args.lr,
        max_tokens=args.max_tokens,
        builder=args.builder,
        timeout_s=args.timeout,
        seed=args.seed,
        dashboard=not args.no_dashboard,
        run_dir=Path(args.run_dir).resolve()
        if args.run_dir
        else state_home(args.state_dir) / "runs" / time.strftime("%Y%m%d-%H%M%S"),
    )
    try:
        return Demo(cfg).run()
    except KeyboardInterrupt:
        print("\ninterrupted; everything was stopped", file=sys.stderr)
        return 130


# --------------------------------------------------------------------------------------------------- the run


class Demo:
    def __init__(self, cfg: DemoConfig, env_overrides: dict[str, dict[str, str]] | None = None) -> None:
        self.cfg = cfg
        self.env_overrides = env_overrides or {}  # service name -> extra env (tests: shorter deadlines, …)
        self.run_dir = cfg.run_dir
        self.broker = LocalBroker.at(self.run_dir / "kafka")
        self.ports = {name: free_port() for name in ("inference", "gateway", "rollout", "dashboard")}
        self.kafka = KafkaSettings()
        self.stack: Stack | None = None
        self.started = time.monotonic()
        # Sandboxed harnesses and graders run as unprivileged uids that must traverse their work directories, and a
        # run directory may sit under a private (0700) parent such as pytest's tmp_path: keep those two elsewhere.
        self.sandbox_root = (
            Path(tempfile.gettempdir()) / f"floe-run-{hashlib.sha1(str(cfg.run_dir).encode()).hexdigest()[:10]}"
        )

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {msg}", flush=True)

    def _sandbox_dirs(self) -> None:
        self.sandbox_root.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.sandbox_root.chmod(0o755)

    def up(self) -> None:
        """Start the broker, create the topics and the model, start every service and wait until each is ready.
        Tests call this, then drive ``self.stack`` (kill -9, restart) and ``restart_broker``; ``down`` undoes it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.say(f"run directory {self.run_dir}")
        address = self.broker.start(free_port(), free_port(), owner_pid=os.getpid())
        self.kafka = KafkaSettings(bootstrap_servers=address)
        self.say(f"kafka ready at {address}")
        ensure_topics_sync(self.kafka, TOPICS)
        self.init_model()
        self._sandbox_dirs()
        self.stack = Stack(self.run_dir, base_env=self.base_env())
        for spec in self.services():
            self.stack.start(spec)
            self.say(f"{spec.name} up")
        if self.cfg.dashboard:
            self.say(f"dashboard: http://127.0.0.1:{self.ports['dashboard']}/")

    def restart_broker(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after a deadline) and start it again on the same ports and data."""
        self.broker.stop()
        address = self.broker.start(owner_pid=os.getpid())
        assert address == self.kafka.bootstrap_servers, f"broker came back on {address}"

    def down(self) -> None:
        if self.stack is not None:
            self.stack.stop_all()
            self.say("services stopped")
        self.broker.stop()
        shutil.rmtree(self.sandbox_root, ignore_errors=True)

    def run(self) -> int:
        try:
            self.up()
            steps = asyncio.run(self.watch())
        except BrokerError as exc:
            print(f"floe demo: Kafka did not start: {exc}", file=sys.stderr)
            return 1
        except (StackError, EventBusError, subprocess.CalledProcessError, TimeoutError) as exc:
            print(f"floe demo failed: {exc}\nlogs: {self.run_dir / 'logs'}", file=sys.stderr)
            return 1
        finally:
            self.down()
        out = write_report(self.run_dir / "report", steps, self.config_dict())
        summary = summarize(steps)
        self.say(
            f"done: reward {summary.get('reward_first')} (first {summary.get('window')} steps) -> "
            f"{summary.get('reward_last')} (last {summary.get('window')}) over {summary.get('steps')} steps"
        )
        print(f"report: {out}/README.md  plot: {out}/reward.png")
        return 0 if len(steps) >= self.cfg.steps else 1

    def config_dict(self) -> dict[str, Any]:
        return {**asdict(self.cfg), "run_dir": str(self.run_dir), "ports": self.ports}

    # ------------------------------------------------------------------------------------------------- setup

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOE_")}
        env.update(
            {
                "FLOE_KAFKA_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers,
                # Two cores, six services: one torch thread each keeps them from fighting over the CPU.
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        return env

    def init_model(self) -> None:
        model = self.run_dir / "model"
        if not (model / "config.json").exists():
            self.say("creating the tiny dev model")
            subprocess.run(
                [sys.executable, "-m", "floe", "inference", "init-model", "--out", str(model)],
                check=True,
                stdout=subprocess.DEVNULL,
                env=self.base_env(),
                timeout=600,
            )

    def services(self) -> list[ServiceSpec]:
        cfg, run, ports = self.cfg, self.run_dir, self.ports
        sampling = {"temperature": cfg.temperature, "top_p": 1.0, "max_tokens": cfg.max_tokens, "seed": None}
        if cfg.workload != "toy":
            sampling["max_tokens"] = 512
        runs = [
            {
                "name": cfg.workload,
                "task_source": cfg.task_source,
                "harness": cfg.harness,
                "group_size": cfg.group_size,
                "sampling": sampling,
                "model": "policy",
                "agent_timeout_s": 120 if cfg.workload == "toy" else 600,
                "session_timeout_s": 300 if cfg.workload == "toy" else 900,
            }
        ]
        specs = [
            ServiceSpec(
                "inference",
                python_module("inference"),
                {
                    "FLOE_INFERENCE_MODEL_DIR": str(run / "model"),
                    "FLOE_INFERENCE_PORT": str(ports["inference"]),
                    "FLOE_INFERENCE_SEED": str(cfg.seed),
                    "FLOE_INFERENCE_ACCEPT_ANY_MODEL": "true",
                },
                ready_url=f"http://127.0.0.1:{ports['inference']}/health",
            ),
            ServiceSpec(
                "gateway",
                python_module("sessions"),  # a gateway node: the proxy and the session runner in one process
                {
                    "FLOE_GATEWAY_PORT": str(ports["gateway"]),
                    "FLOE_GATEWAY_ENGINE_URLS": json.dumps([f"http://127.0.0.1:{ports['inference']}"]),
                    "FLOE_GATEWAY_SESSIONS_WORK_ROOT": str(self.sandbox_root / "sessions"),
                    "FLOE_GATEWAY_SESSIONS_NODE_ID": "demo-node-1",
                    "FLOE_GATEWAY_SESSIONS_MAX_RUNNING": "4",
                    "FLOE_GATEWAY_SESSIONS_MAX_PREPARING": "4",
                },
                ready_url=f"http://127.0.0.1:{ports['gateway']}/health",
            ),
            ServiceSpec(
                "scorer",
                python_module("scorer"),
                {"FLOE_SCORER_WORK_DIR": str(self.sandbox_root / "scorer")},
            ),
            ServiceSpec(
                "learner",
                python_module("learner"),
                {
                    "FLOE_LEARNER_MODEL_DIR": str(run / "model"),
                    "FLOE_LEARNER_CHECKPOINT_DIR": str(run / "checkpoints"),
                    "FLOE_LEARNER_LR": str(cfg.lr),
                    "FLOE_LEARNER_KL_COEF": "0",
                    "FLOE_LEARNER_WEIGHT_DECAY": "0",
                    "FLOE_LEARNER_MAX_STALENESS": str(cfg.max_off_policy_steps + 1),
                    "FLOE_LEARNER_SEED": str(cfg.seed),
                    "FLOE_LEARNER_DEVICE": "cpu",
                },
            ),
            ServiceSpec(
                "rollout",
                python_module("rollout"),
                {
                    "FLOE_ROLLOUT_SCHEDULE": "true",
                    "FLOE_ROLLOUT_RUNS": json.dumps(runs),
                    "FLOE_ROLLOUT_GROUPS_PER_STEP": str(cfg.groups_per_step),
                    "FLOE_ROLLOUT_GROUPS_PER_BATCH": str(cfg.groups_per_step),
                    "FLOE_ROLLOUT_MAX_GROUPS_IN_FLIGHT": str(cfg.groups_per_step * 2),
                    "FLOE_ROLLOUT_MAX_OFF_POLICY_STEPS": str(cfg.max_off_policy_steps),
                    "FLOE_ROLLOUT_BUILDER": cfg.builder,
                    "FLOE_ROLLOUT_DROP_ZERO_SIGNAL_GROUPS": "false",
                    "FLOE_ROLLOUT_CLAIM_URL": str(run / "rollout" / "batches"),
                    "FLOE_ROLLOUT_DATASET_DIR": str(run / "rollout" / "dataset"),
                    "FLOE_ROLLOUT_HTTP_PORT": str(ports["rollout"]),
                    "FLOE_ROLLOUT_GROUP_DEADLINE_S": "600",
                },
                ready_url=f"http://127.0.0.1:{ports['rollout']}/health",
            ),
        ]
        specs = [
            ServiceSpec(sp.name, sp.argv, {**sp.env, **self.env_overrides.get(sp.name, {})}, sp.ready_url)
            for sp in specs
        ]
        if self.cfg.dashboard:
            specs.append(
                ServiceSpec(
                    "dashboard",
                    python_module("dashboard"),
                    {"FLOE_DASHBOARD_PORT": str(ports["dashboard"])},
                    ready_url=f"http://127.0.0.1:{ports['dashboard']}/health",
                )
            )
        return specs

    # ------------------------------------------------------------------------------------------------- watch

    def _check(self, deadline: float, done: int) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {done} of {self.cfg.steps} steps after {self.cfg.timeout_s:.0f}s")
        assert self.stack is not None
        dead = self.stack.dead()
        if dead:
            raise StackError(f"service(s) died: {', '.join(dead)}\n{self.stack.tail(dead[0])}")

    def _record(self, step: int, event: WeightsPublished, stats: dict[str, float]) -> StepRecord:
        return StepRecord(
            step=step,
            version=event.version,
            sessions=int(stats["sessions"]),
            reward_mean=stats["reward_mean"],
            reward_std=stats["reward_std"],
            resolved_fraction=stats["resolved"],
            trainable_tokens=int(stats["trainable"]),
            loss=event.metrics.get("loss"),
            elapsed_s=time.monotonic() - self.started,
        )

    async def watch(self) -> list[StepRecord]:
        """Follow batches and weight versions until ``steps`` versions are published; one line per step."""
        from tqdm import tqdm

        cfg = self.cfg
        batches: dict[str, dict[str, float]] = {}  # batch id -> stats, until the learner publishes its version
        steps: list[StepRecord] = []
        deadline = time.monotonic() + cfg.timeout_s
        bar = tqdm(total=cfg.steps, desc="GRPO steps", unit="step", file=sys.stderr, dynamic_ncols=True)
        topics: list[Topic[Any]] = [TRAJECTORY_BATCHES, WEIGHTS]
        async with Consumer(self.kafka, topics, group_id=f"demo-{os.getpid()}") as consumer:
            # A pump task feeds a queue, so the loop can wake up every second to check deadlines and dead services
            # without cancelling the consumer's iterator.
            queue: asyncio.Queue[Message[Any]] = asyncio.Queue()

            async def pump() -> None:
                async for msg in consumer:
                    await queue.put(msg)

            pumping = asyncio.create_task(pump())
            try:
                while len(steps) < cfg.steps:
                    self._check(deadline, len(steps))
                    if pumping.done():
                        pumping.result()  # re-raise what stopped the consumer
                        raise EventBusError("the demo's consumer stopped")
                    try:
                        msg = await asyncio.wait_for(queue.get(), timeout=1.0)
                    except TimeoutError:
                        continue
                    event = msg.event
                    if isinstance(event, TrajectoryBatch):
                        batches[event.batch_id] = _batch_stats(event)
                    elif isinstance(event, WeightsPublished) and event.batch_id in batches:
                        record = self._record(len(steps) + 1, event, batches.pop(event.batch_id))
                        steps.append(record)
                        bar.update(1)
                        bar.write(_status_line(record))
            finally:
                pumping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pumping
        bar.close()
        return steps


def _status_line(r: StepRecord) -> str:
    loss = f"{r.loss:+.4f}" if r.loss is not None else "n/a"
    return (
        f"step {r.step:3d}  v{r.version:<3d} sessions {r.sessions:3d}  reward {r.reward_mean:.3f} ± {r.reward_std:.3f}"
        f"  solved {100 * r.resolved_fraction:5.1f}%  trainable {r.trainable_tokens:5d}  loss {loss}  "
        f"t={r.elapsed_s:.0f}s"
    )


def _batch_stats(batch: TrajectoryBatch) -> dict[str, float]:
    """Per-session reward stats and trainable tokens of one batch (inline or claim-checked)."""
    if batch.arrow_ipc is not None:
        table = read_ipc(batch.arrow_ipc)
    else:
        assert batch.uri is not None
        table = read_ipc(Path(batch.uri.removeprefix("file://")).read_bytes())
    rewards: dict[str, float] = {}
    for sid, reward in zip(table.column("session_id").to_pylist(), table.column("reward").to_pylist(), strict=True):
        rewards[sid] = float(reward)
    values = list(rewards.values()) or [0.0]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    trainable = sum(sum(mask) for mask in table.column("loss_mask").to_pylist())
    return {
        "sessions": float(len(rewards)),
        "reward_mean": mean,
        "reward_std": std,
        "resolved": sum(1 for v in values if v >= 1.0) / len(values),
        "trainable": float(trainable),
    }
