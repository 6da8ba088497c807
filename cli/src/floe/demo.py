"""``floe demo``: the main job on the embedded default — every service as its own process over a real Kafka broker.

What it runs (each a separate process, logs in ``<run>/logs/``):

- a fresh single-node Kafka broker (``deploy/kafka/kafka.sh``) on free ports, state in ``<run>/kafka``;
- ``inference``: the CPU engine (or ``--engine vllm``: the real vLLM behind floe's weight-version proxy) serving the
  policy, hot-reloading every published version;
- ``gateway``: the model-API proxy + session runner (harnesses in bubblewrap sandboxes);
- ``scorer``: grades each session (``answer`` evaluator for the toy tasks, SWE-bench rules for ``--workload swe``);
- ``rollout``: schedules GRPO groups, rebuilds trajectories, publishes Arrow batches;
- ``learner``: GRPO steps, checkpoints, ``WeightsPublished``;
- ``dashboard``: the live web page.

Default: the real SmolLM2-135M-Instruct (``floe model fetch smollm2-135m``, cached) on the ``count`` tasks ("What
number comes after / before 47?"), answered by the toy agent (the official ``openai`` SDK against the gateway, one
call) and graded exactly (1 when the reply's first number is the answer, else 0; no format credit). A held-out set
(``count-heldout``: numbers never trained on) runs as *eval* sessions — the scheduler's eval priority, never trained on
— before the first step, every ``--eval-every`` steps and after the last, with the training sampling; the report puts
``eval_solve_rate_before`` / ``_after`` next to the best a prompt-agnostic (constant) answer can reach.

``--model tiny`` is the old fast run (a random 0.2M-parameter model, one-digit sums with partial credit for digits: it
learns the format in minutes, nothing that depends on the prompt). ``--workload swe --harness pi`` runs the bundled
SWE tasks with a real harness: the pipeline runs end to end; neither model is expected to learn to fix bugs.
``--tasks FILE`` trains on a task set of your own instead of the workload's (a SWE-bench JSONL or Parquet file with
its ``repos/`` folder: docs/bring-your-own-swe-tasks.md); it gets no held-out eval unless ``--eval-tasks FILE`` names
one. Both are loaded before anything starts, so a file that does not load fails the demo at once.

The demo itself only watches the topics (its own consumer group): per training step it prints one status line; at
the end it writes ``<run>/report/`` (solve-rate PNG, config, summary) and stops everything it started.
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
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts import (
    REWARDS,
    SESSIONS_REQUESTED,
    TOPICS,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    Outcome,
    RewardPublished,
    SessionKind,
    SessionRequested,
    Topic,
    TrajectoryBatch,
    WeightsPublished,
    read_ipc,
)
from eventbus import Consumer, EventBusError, KafkaSettings, Message, ensure_topics_sync
from eventbus.broker import BrokerError, LocalBroker, free_ports
from floe.home import state_home
from floe.hosts import Host
from floe.report import EvalRound, StepRecord, prompt_agnostic_best, summarize, write_report
from floe.stack import ServiceSpec, Stack, StackError, python_module

__all__ = ["DemoConfig", "add_parser", "run"]


@dataclass(frozen=True)
class ModelPreset:
    """Defaults chosen by measurement for one policy model on this 2-core machine kind (docs: README, demo section)."""

    workload: str
    steps: int
    group_size: int
    groups_per_step: int
    lr: float
    eval_every: int
    # torch threads of the inference engine and of the learner, each. They run at the same time (asynchronous
    # collection): on 2 cores, 2 + 2 OpenMP threads spinning for each other cut the engine from 3.3 to 0.8 calls/s and
    # slowed a learner step from ~18 s to 48 s; 1 + 1 kept the engine at ~3 calls/s (a 135M model's decode gains
    # nothing from a second thread) with a step of ~23 s (measured by hand: README, demo section).
    threads: int
    group_selection: str


PRESETS: dict[str, ModelPreset] = {
    "smollm2": ModelPreset(
        "count", steps=10, group_size=8, groups_per_step=4, lr=5e-5, eval_every=5, threads=1, group_selection="off"
    ),
    "tiny": ModelPreset(
        "toy", steps=20, group_size=8, groups_per_step=2, lr=2e-2, eval_every=0, threads=1, group_selection="off"
    ),
}
# Which task set a workload trains on, and its held-out set (None: no eval).
WORKLOADS: dict[str, tuple[str, str | None]] = {
    "count": ("count", "count-heldout"),
    "toy": ("toy", None),
    "swe": ("bundled", None),
}


@dataclass
class DemoConfig:
    model: str = "smollm2"
    engine: str = "cpu"
    steps: int = 10
    workload: str = "count"
    harness: str = "toy-stdlib"
    group_size: int = 8
    groups_per_step: int = 4
    lr: float = 5e-5
    max_tokens: int = 8
    temperature: float = 1.0
    max_off_policy_steps: int = 2
    builder: str = "prefix_merging"
    group_selection: str = "off"
    eval_every: int = 5
    eval_samples: int = 1
    threads: int = 1
    timeout_s: float = 1800.0
    seed: int = 0
    dashboard: bool = True
    run_dir: Path = field(default_factory=lambda: Path("."))
    # A task set of the user's own (a shipped set's name or a task file; ``for_model`` makes a path absolute) in
    # place of the workload's, and its held-out set. A user's set has no held-out set unless ``eval_tasks`` is given.
    tasks: str | None = None
    eval_tasks: str | None = None
    # Instances over the one broker (docs/scaling.md): gateway nodes share the session requests' partitions, scorers
    # the finished sessions', and the learner runs that many torchrun ranks (gloo on CPU).
    gateway_nodes: int = 1
    scorers: int = 1
    learner_ranks: int = 1
    # Rollout instances: each assembles the groups of its share of the partitions; the one that owns
    # floe.rollout.groups leads (selection, batches, scheduling).
    rollouts: int = 1
    # A session's own deadline (SessionRequested.session_timeout_s); default 300 s (toy) or 900 s (swe). The agent's
    # timeout is at most this.
    session_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("gateway_nodes", "scorers", "learner_ranks", "rollouts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', ' ')} must be at least 1")

    @property
    def task_source(self) -> str:
        return self.tasks or WORKLOADS[self.workload][0]

    @property
    def eval_source(self) -> str | None:
        if self.eval_every <= 0:
            return None
        if self.eval_tasks is not None or self.tasks is not None:
            return self.eval_tasks
        return WORKLOADS[self.workload][1]

    @property
    def eval_rounds(self) -> int:
        """Eval passes at versions 0, N, 2N, ... and always one after the last step."""
        if self.eval_source is None:
            return 0
        return math.ceil(self.steps / self.eval_every) + 1

    @classmethod
    def for_model(cls, model: str, **overrides: Any) -> DemoConfig:
        preset = PRESETS[model]
        base: dict[str, Any] = {
            "model": model,
            "workload": preset.workload,
            "steps": preset.steps,
            "group_size": preset.group_size,
            "groups_per_step": preset.groups_per_step,
            "lr": preset.lr,
            "eval_every": preset.eval_every,
            "threads": preset.threads,
            "group_selection": preset.group_selection,
        }
        base.update({k: v for k, v in overrides.items() if v is not None})
        for key in ("tasks", "eval_tasks"):
            if base.get(key) is not None:
                base[key] = task_source_of(base[key])
        cfg = cls(**base)
        if cfg.eval_tasks is not None and cfg.eval_every <= 0:
            raise ValueError("--eval-tasks needs --eval-every N (N > 0): held-out rounds every N steps")
        if cfg.eval_source is not None and cfg.steps % cfg.eval_every:
            raise ValueError(f"--steps ({cfg.steps}) must be a multiple of --eval-every ({cfg.eval_every})")
        return cfg


def task_source_of(name_or_path: str) -> str:
    """A shipped set's name as it is, a path made absolute: the rollout, the session runner and the scorer each
    resolve the ``task_source`` they are sent in their own process and working directory."""
    from floe_tasks import NAMED_SETS

    return name_or_path if name_or_path in NAMED_SETS else str(Path(name_or_path).resolve())


def check_task_sources(cfg: DemoConfig) -> None:
    """Load the training and held-out sets as the services will, and require a snapshot for every task that names a
    base commit: raises the loader's ``TaskError`` (or ``ValueError`` for an empty set) before anything starts,
    rather than after the broker and six services are up and every session has failed the same way."""
    from floe_tasks import TaskSet

    for source in (cfg.task_source, cfg.eval_source):
        if source is None:
            continue
        taskset = TaskSet.from_source(source)
        if not len(taskset):
            raise ValueError(f"task set {source} holds no tasks")
        for task in taskset:
            task.require_snapshot()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="the main job: every service over a local Kafka, GRPO steps, a report")
    p.add_argument(
        "--model",
        choices=sorted(PRESETS),
        default="smollm2",
        help="smollm2: the real SmolLM2-135M-Instruct (default); tiny: a random 0.2M model (fast, format only)",
    )
    p.add_argument(
        "--engine", choices=["cpu", "vllm"], default="cpu", help="cpu: floe's CPU engine; vllm: the real vLLM"
    )
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (trajectory batches) to train")
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default=None,
        help="count: next/previous number, exact reward, held-out eval (smollm2's default); toy: one-digit sums with "
        "digit credit (tiny's default); swe: bundled SWE tasks (or --tasks FILE) with a real harness",
    )
    p.add_argument("--harness", default=None, help="harness preset (default: toy-stdlib, or pi for swe)")
    p.add_argument(
        "--tasks",
        default=None,
        metavar="FILE",
        help="train on this task set instead of the workload's: a SWE-bench JSONL or Parquet file, its snapshots in "
        "repos/ next to it (docs/bring-your-own-swe-tasks.md); no held-out eval unless --eval-tasks",
    )
    p.add_argument(
        "--eval-tasks",
        default=None,
        metavar="FILE",
        help="held-out set (same formats) run as eval sessions every --eval-every steps, never trained on",
    )
    p.add_argument("--group-size", type=int, default=None, help="sessions per GRPO group (G)")
    p.add_argument("--groups-per-step", type=int, default=None)
    p.add_argument("--lr", type=float, default=None, help="learner learning rate")
    p.add_argument("--max-tokens", type=int, default=None, help="toy agent: tokens per answer (default 8)")
    p.add_argument("--builder", choices=["prefix_merging", "per_request"], default=None)
    p.add_argument(
        "--group-selection",
        choices=["off", "drop", "refill"],
        default=None,
        help="groups whose rewards are all equal carry no signal: keep them (off, the default), drop them (drop: a "
        "step with no signal left is skipped), or drop them and sample replacements (refill: more sessions per step)",
    )
    p.add_argument("--eval-every", type=int, default=None, help="held-out eval every N steps (0: none)")
    p.add_argument("--eval-samples", type=int, default=None, help="samples per held-out task and eval round")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads of the engine and of the learner, each (default 1)"
    )
    p.add_argument("--gateway-nodes", type=int, default=None, help="gateway nodes (default 1)")
    p.add_argument("--scorers", type=int, default=None, help="scorer instances (default 1)")
    p.add_argument("--learner-ranks", type=int, default=None, help="learner ranks under torchrun (default 1)")
    p.add_argument("--rollouts", type=int, default=None, help="rollout instances (default 1)")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--run-dir", default=None, help="default: <state home>/runs/<timestamp>")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload = args.workload
    harness = args.harness or ("pi" if workload == "swe" else None)
    try:
        cfg = DemoConfig.for_model(
            args.model,
            engine=args.engine,
            steps=args.steps,
            workload=workload,
            harness=harness,
            group_size=args.group_size,
            groups_per_step=args.groups_per_step,
            lr=args.lr,
            max_tokens=args.max_tokens,
            builder=args.builder,
            group_selection=args.group_selection,
            eval_every=args.eval_every,
            eval_samples=args.eval_samples,
            timeout_s=args.timeout,
            threads=args.threads,
            seed=args.seed,
            tasks=args.tasks,
            eval_tasks=args.eval_tasks,
            gateway_nodes=args.gateway_nodes,
            scorers=args.scorers,
            learner_ranks=args.learner_ranks,
            rollouts=args.rollouts,
            dashboard=not args.no_dashboard,
            run_dir=Path(args.run_dir).resolve()
            if args.run_dir
            else state_home(args.state_dir) / "runs" / time.strftime("%Y%m%d-%H%M%S"),
        )
    except ValueError as exc:
        print(f"floe demo: {exc}", file=sys.stderr)
        return 2
    from floe_tasks import TaskError

    try:
        check_task_sources(cfg)
    except (TaskError, ValueError) as exc:
        print(f"floe demo: {exc}", file=sys.stderr)
        return 2
    try:
        return Demo(cfg).run()
    except KeyboardInterrupt:
        print("\ninterrupted; everything was stopped", file=sys.stderr)
        return 130


# --------------------------------------------------------------------------------------------------- the run


class Demo:
    def __init__(
        self,
        cfg: DemoConfig,
        env_overrides: dict[str, dict[str, str]] | None = None,
        hosts: Mapping[str, Host] | None = None,
    ) -> None:
        self.cfg = cfg
        self.env_overrides = env_overrides or {}  # service name -> extra env (tests: shorter deadlines, …)
        # Service name (or "kafka") -> the simulated host it runs on (floe.hosts; the multi-host tests). A placed
        # service listens on every address of its namespace, and the others reach it at its host's address.
        self.hosts = dict(hosts or {})
        self.run_dir = cfg.run_dir
        self.broker = LocalBroker.at(self.run_dir / "kafka")
        names = ["inference", *self.gateway_names(), *self.rollout_names(), "dashboard"]
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))  # distinct: bound together
        self.kafka = KafkaSettings()
        self.stack: Stack | None = None
        self.model_dir = self.run_dir / "model"
        self.started = time.monotonic()
        self.sessions: _Sessions | None = None  # what ``watch`` saw: requests and rewards by session
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

    def up(self, only: Collection[str] | None = None) -> None:
        """Start the broker, create the topics and the model, start every service (or those named in ``only``) and
        wait until each is ready. Tests call this, then drive ``self.stack`` (kill -9, restart) and
        ``restart_broker``; ``down`` undoes it. Benchmarks pass ``only`` to run part of the stack."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.say(f"run directory {self.run_dir}")
        address = self.broker.start(*free_ports(2), owner_pid=os.getpid(), **self._broker_placement())
        self.kafka = KafkaSettings(bootstrap_servers=address)
        self.say(f"kafka ready at {address}")
        ensure_topics_sync(self.kafka, TOPICS)
        self.init_model()
        self._sandbox_dirs()
        self.stack = Stack(self.run_dir, base_env=self.base_env())
        # Everything but the gateway starts at once (each loads torch or a model; they only meet over Kafka); the
        # gateway waits for the engine it proxies. Readiness is awaited in order, so a failure names its service.
        specs = [spec for spec in self.services() if only is None or spec.name in only]
        gateways = set(self.gateway_names())
        for spec in specs:
            if spec.name not in gateways:
                self.stack.start(spec, wait=False)
        for spec in specs:
            if spec.name in gateways:
                self.stack.start(spec)
            else:
                self.stack.wait_ready(spec.name)
            self.say(f"{spec.name} up")
        if self.cfg.dashboard:
            self.say(f"dashboard: http://127.0.0.1:{self.ports['dashboard']}/")

    def restart_broker(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after a deadline) and start it again on the same ports and data."""
        self.broker.stop()
        address = self.broker.start(owner_pid=os.getpid(), **self._broker_placement())
        assert address == self.kafka.bootstrap_servers, f"broker came back on {address}"

    def _broker_placement(self) -> dict[str, Any]:
        host = self.hosts.get("kafka")
        return {} if host is None else {"host": host.address, "wrap": host.argv([])}

    def address(self, name: str) -> str:
        """Where the other services (and this process) reach service ``name``."""
        host = self.hosts.get(name)
        return "127.0.0.1" if host is None else host.address

    def _bind(self, name: str) -> str:
        return "127.0.0.1" if name not in self.hosts else "0.0.0.0"  # every address of its own namespace only

    def down(self) -> None:
        # A second Ctrl-C (or a wrapper forwarding the first one again) must not cut the shutdown short and leave
        # services running: ignore SIGINT until everything is stopped.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            if self.stack is not None:
                self.stack.stop_all()
                self.say("services stopped")
            self.broker.stop()
            shutil.rmtree(self.sandbox_root, ignore_errors=True)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def run(self) -> int:
        try:
            self.up()
            steps, rounds = asyncio.run(self.watch())
        except BrokerError as exc:
            print(f"floe demo: Kafka did not start: {exc}", file=sys.stderr)
            return 1
        except (StackError, EventBusError, subprocess.CalledProcessError, TimeoutError) as exc:
            print(f"floe demo failed: {exc}\nlogs: {self.run_dir / 'logs'}", file=sys.stderr)
            return 1
        finally:
            self.down()
        agnostic = prompt_agnostic_best(eval_answers(self.cfg))
        out = write_report(self.run_dir / "report", steps, self.config_dict(), rounds, agnostic)
        summary = summarize(steps, rounds, agnostic)
        by_task = self.write_task_report(out)
        self.say(f"graded {sum(r['sessions'] for r in by_task.values())} sessions of {len(by_task)} tasks")
        if rounds:
            baseline = "" if agnostic is None else f" (a prompt-agnostic answer reaches at most {agnostic})"
            self.say(
                f"done: held-out solve rate {summary['eval_solve_rate_before']} -> {summary['eval_solve_rate_after']}"
                f" over {summary['steps']} steps{baseline}"
            )
        else:
            self.say(
                f"done: reward {summary.get('reward_first')} (first {summary.get('window')} steps) -> "
                f"{summary.get('reward_last')} (last {summary.get('window')}) over {summary.get('steps')} steps"
            )
        print(f"report: {out}/README.md  plot: {out}/reward.png")
        finished = len(rounds) >= self.cfg.eval_rounds and (bool(rounds) or len(steps) >= self.cfg.steps)
        return 0 if finished else 1

    def config_dict(self) -> dict[str, Any]:
        return {**asdict(self.cfg), "run_dir": str(self.run_dir), "ports": self.ports}

    def write_task_report(self, out: Path) -> dict[str, dict[str, int]]:
        """``<report>/tasks.json``: graded sessions per task of the sets the run used, so a user's own set can be
        read task by task (which tasks any session solved, which only errored)."""
        by_task = self.sessions.by_task() if self.sessions is not None else {}
        doc = {"task_source": self.cfg.task_source, "eval_source": self.cfg.eval_source, "tasks": by_task}
        (out / "tasks.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return by_task

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
        """The policy's starting checkpoint: the cached SmolLM2 (fetched once, read-only) or a fresh tiny model."""
        if self.cfg.model == "smollm2":
            self.say("fetching SmolLM2-135M-Instruct (cached after the first run)")
            out = subprocess.run(
                [sys.executable, "-m", "floe", "model", "fetch", "smollm2-135m", "--json"],
                check=True,
                capture_output=True,
                text=True,
                env=self.base_env(),
                timeout=1800,
            )
            self.model_dir = Path(json.loads(out.stdout)["path"])
            return
        self.model_dir = self.run_dir / "model"
        if not (self.model_dir / "config.json").exists():
            self.say("creating the tiny dev model")
            subprocess.run(
                [sys.executable, "-m", "floe", "inference", "init-model", "--out", str(self.model_dir)],
                check=True,
                stdout=subprocess.DEVNULL,
                env=self.base_env(),
                timeout=600,
            )

    def run_specs(self) -> list[dict[str, Any]]:
        """The rollout's runs: the training run and, when the workload has one, the held-out eval run."""
        cfg = self.cfg
        sampling = {"temperature": cfg.temperature, "top_p": 1.0, "max_tokens": cfg.max_tokens, "seed": None}
        if cfg.workload == "swe":
            sampling["max_tokens"] = 512
        session_timeout_s = cfg.session_timeout_s or (900 if cfg.workload == "swe" else 300)
        common = {
            "harness": cfg.harness,
            "sampling": sampling,
            "model": "policy",
            "agent_timeout_s": min(600 if cfg.workload == "swe" else 120, session_timeout_s),
            "session_timeout_s": session_timeout_s,
        }
        runs: list[dict[str, Any]] = [
            {
                "name": cfg.workload,
                "task_source": cfg.task_source,
                "group_size": cfg.group_size,
                "shuffle_seed": cfg.seed,  # --seed changes the task order too, not only the sampling
                **common,
            }
        ]
        if cfg.eval_source is not None:
            runs.append(
                {
                    "name": "heldout",
                    "kind": "eval",
                    "task_source": cfg.eval_source,
                    "group_size": cfg.eval_samples,
                    "every_steps": cfg.eval_every,
                    "epochs": cfg.eval_rounds,
                    **common,
                }
            )
        return runs

    @staticmethod
    def instance_names(kind: str, n: int) -> list[str]:
        """``kind`` for the first instance (as in a one-instance run), then ``kind-2``, ``kind-3``..."""
        return [kind if i == 0 else f"{kind}-{i + 1}" for i in range(n)]

    def gateway_names(self) -> list[str]:
        return self.instance_names("gateway", self.cfg.gateway_nodes)

    def rollout_names(self) -> list[str]:
        return self.instance_names("rollout", self.cfg.rollouts)

    def learner_argv(self) -> list[str]:
        if self.cfg.learner_ranks == 1:
            return python_module("learner")
        # torchrun's agent restarts the whole worker group when a rank dies (DDP cannot go on without it); the ranks
        # resume from the last checkpoint and the ledger skips a batch trained before the crash.
        return python_module(
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(self.cfg.learner_ranks),
            "--max-restarts",
            "3",
            "-m",
            "learner",
        )

    def services(self) -> list[ServiceSpec]:
        cfg, run, ports = self.cfg, self.run_dir, self.ports
        runs = self.run_specs()
        threads = {
            "OMP_NUM_THREADS": str(cfg.threads),
            "MKL_NUM_THREADS": str(cfg.threads),
            # Idle OpenMP workers sleep instead of spinning: the engine and the learner share the cores.
            "OMP_WAIT_POLICY": "PASSIVE",
        }
        specs = [
            ServiceSpec(
                "inference",
                python_module("inference"),
                {
                    "FLOE_INFERENCE_ENGINE": cfg.engine,
                    "FLOE_INFERENCE_MODEL_DIR": str(self.model_dir),
                    "FLOE_INFERENCE_HOST": self._bind("inference"),
                    "FLOE_INFERENCE_PORT": str(ports["inference"]),
                    "FLOE_INFERENCE_SEED": str(cfg.seed),
                    "FLOE_INFERENCE_ACCEPT_ANY_MODEL": "true",
                    "FLOE_INFERENCE_THREADS": str(cfg.threads),
                    **threads,
                },
                ready_url=f"http://{self.address('inference')}:{ports['inference']}/health",
            ),
            *(
                ServiceSpec(
                    name,
                    python_module("sessions"),  # a gateway node: the proxy and the session runner in one process
                    {
                        "FLOE_GATEWAY_HOST": self._bind(name),
                        "FLOE_GATEWAY_PORT": str(ports[name]),
                        "FLOE_GATEWAY_PUBLIC_URL": f"http://{self.address(name)}:{ports[name]}",
                        "FLOE_GATEWAY_ENGINE_URLS": json.dumps(
                            [f"http://{self.address('inference')}:{ports['inference']}"]
                        ),
                        "FLOE_GATEWAY_SESSIONS_WORK_ROOT": str(self.sandbox_root / name.replace("gateway", "sessions")),
                        "FLOE_GATEWAY_SESSIONS_NODE_ID": f"demo-node-{i + 1}",
                        # One-call answer agents mostly wait on the engine: more at once means bigger decode batches.
                        "FLOE_GATEWAY_SESSIONS_MAX_RUNNING": "4" if cfg.workload == "swe" else "8",
                        "FLOE_GATEWAY_SESSIONS_MAX_PREPARING": "4",
                    },
                    ready_url=f"http://{self.address(name)}:{ports[name]}/health",
                )
                for i, name in enumerate(self.gateway_names())
            ),
            *(
                ServiceSpec(
                    name,
                    python_module("scorer"),
                    {
                        "FLOE_SCORER_WORK_DIR": str(self.sandbox_root / name),
                        # Stable per instance (it fences a crashed incarnation) and distinct between instances:
                        # the default, scorer-<hostname>, would make two scorers on one host fence each other.
                        "FLOE_SCORER_TRANSACTIONAL_ID": f"demo-{name}",
                    },
                )
                for name in self.instance_names("scorer", cfg.scorers)
            ),
            ServiceSpec(
                "learner",
                self.learner_argv(),
                {
                    **threads,
                    "FLOE_LEARNER_MODEL_DIR": str(self.model_dir),
                    "FLOE_LEARNER_CHECKPOINT_DIR": str(run / "checkpoints"),
                    "FLOE_LEARNER_LR": str(cfg.lr),
                    "FLOE_LEARNER_KL_COEF": "0",
                    "FLOE_LEARNER_WEIGHT_DECAY": "0",
                    "FLOE_LEARNER_MAX_STALENESS": str(cfg.max_off_policy_steps + 1),
                    "FLOE_LEARNER_SEED": str(cfg.seed),
                    "FLOE_LEARNER_DEVICE": "cpu",
                },
            ),
            *(
                ServiceSpec(
                    name,
                    python_module("rollout"),
                    {
                        "FLOE_ROLLOUT_SCHEDULE": "true",
                        "FLOE_ROLLOUT_RUNS": json.dumps(runs),
                        "FLOE_ROLLOUT_GROUPS_PER_STEP": str(cfg.groups_per_step),
                        "FLOE_ROLLOUT_GROUPS_PER_BATCH": str(cfg.groups_per_step),
                        "FLOE_ROLLOUT_MAX_GROUPS_IN_FLIGHT": str(cfg.groups_per_step * 2),
                        "FLOE_ROLLOUT_MAX_OFF_POLICY_STEPS": str(cfg.max_off_policy_steps),
                        "FLOE_ROLLOUT_BUILDER": cfg.builder,
                        "FLOE_ROLLOUT_GROUP_SELECTION": cfg.group_selection,
                        "FLOE_ROLLOUT_MAX_STEPS": str(cfg.steps),
                        "FLOE_ROLLOUT_CLAIM_URL": str(run / "rollout" / "batches"),
                        "FLOE_ROLLOUT_DATASET_DIR": str(run / "rollout" / "dataset"),
                        # One consumer group (the default "rollout"); the instance id is each one's transactional id.
                        "FLOE_ROLLOUT_INSTANCE_ID": f"demo-{name}",
                        "FLOE_ROLLOUT_HTTP_HOST": self._bind(name),
                        "FLOE_ROLLOUT_HTTP_PORT": str(ports[name]),
                        "FLOE_ROLLOUT_GROUP_DEADLINE_S": "600",
                    },
                    ready_url=f"http://{self.address(name)}:{ports[name]}/health",
                )
                for name in self.rollout_names()
            ),
        ]
        specs = [
            ServiceSpec(
                sp.name,
                self.hosts[sp.name].argv(sp.argv) if sp.name in self.hosts else sp.argv,
                {**sp.env, **self.env_overrides.get(sp.name, {})},
                sp.ready_url,
            )
            for sp in specs
        ]
        if self.cfg.dashboard:
            specs.append(
                ServiceSpec(
                    "dashboard",
                    python_module("dashboard"),
                    {"FLOE_DASHBOARD_HOST": self._bind("dashboard"), "FLOE_DASHBOARD_PORT": str(ports["dashboard"])},
                    ready_url=f"http://{self.address('dashboard')}:{ports['dashboard']}/health",
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

    def _record(self, step: int, event: WeightsPublished, stats: dict[str, float], seen: _Sessions) -> StepRecord:
        train = seen.train_solve_rate(int(stats["rollout_step"]))
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
            train_sessions=train[1],
            train_solve_rate=train[0],
            groups_dropped=int(stats["groups_dropped"]),
        )

    async def watch(self) -> tuple[list[StepRecord], list[EvalRound]]:
        """Follow batches, weight versions and rewards until ``steps`` versions are published and every eval round is
        graded; one line per step and per eval round."""
        from tqdm import tqdm

        cfg = self.cfg
        batches: dict[str, dict[str, float]] = {}  # batch id -> stats, until the learner publishes its version
        steps: list[StepRecord] = []
        seen = self.sessions = _Sessions(self.eval_tasks() * cfg.eval_samples)
        reported: set[int] = set()
        skipped = 0
        deadline = time.monotonic() + cfg.timeout_s
        bar = tqdm(total=cfg.steps, desc="GRPO steps", unit="step", file=sys.stderr, dynamic_ncols=True)
        topics: list[Topic[Any]] = [TRAJECTORY_BATCHES, WEIGHTS, SESSIONS_REQUESTED, REWARDS]
        async with Consumer(self.kafka, topics, group_id=f"demo-{os.getpid()}") as consumer:
            # A pump task feeds a queue, so the loop can wake up every second to check deadlines and dead services
            # without cancelling the consumer's iterator.
            queue: asyncio.Queue[Message[Any]] = asyncio.Queue()

            async def pump() -> None:
                async for msg in consumer:
                    await queue.put(msg)

            pumping = asyncio.create_task(pump())
            try:
                # Under ``drop`` a step whose groups were all dropped publishes no batch (the rollout counts it as
                # skipped: ``steps.skipped_total``), so training ends after ``steps - skipped`` versions.
                while len(steps) + skipped < cfg.steps or len(seen.complete_rounds()) < cfg.eval_rounds:
                    if cfg.eval_rounds and len(seen.complete_rounds()) >= cfg.eval_rounds:
                        break  # the last round is gated on the last step: training is over, skipped steps and all
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
                        skipped = max(skipped, int(event.metrics.get("steps.skipped_total", 0)))
                    elif isinstance(event, WeightsPublished) and event.batch_id in batches:
                        if len(steps) < cfg.steps:
                            record = self._record(len(steps) + 1, event, batches.pop(event.batch_id), seen)
                            steps.append(record)
                            bar.update(1)
                            bar.write(_status_line(record))
                    elif isinstance(event, SessionRequested | RewardPublished):
                        seen.add(event)
                        for r in seen.complete_rounds():
                            if r.round not in reported:
                                reported.add(r.round)
                                bar.write(_eval_line(r, time.monotonic() - self.started))
            finally:
                pumping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pumping
        bar.close()
        return steps, seen.complete_rounds()

    def eval_tasks(self) -> int:
        if self.cfg.eval_source is None:
            return 0
        from floe_tasks import TaskSet

        return len(TaskSet.from_source(self.cfg.eval_source))


def eval_answers(cfg: DemoConfig) -> list[str]:
    """The held-out set's answers, for the prompt-agnostic baseline; empty unless every task has one (a code task's
    solution is a diff, and no constant reply solves it)."""
    if cfg.eval_source is None:
        return []
    from floe_tasks import TaskSet

    answers = [t.answer for t in TaskSet.from_source(cfg.eval_source)]
    return [a for a in answers if a is not None] if None not in answers else []


class _Sessions:
    """Requests and rewards off the topics, joined by session id (the two topics arrive in no particular order)."""

    def __init__(self, round_size: int) -> None:
        self.round_size = round_size
        self.requests: dict[str, SessionRequested] = {}
        self.rewards: dict[str, RewardPublished] = {}

    def add(self, event: SessionRequested | RewardPublished) -> None:
        store: dict[str, Any] = self.requests if isinstance(event, SessionRequested) else self.rewards
        store.setdefault(event.session_id, event)  # redeliveries change nothing: the first copy wins

    def _graded(self, kind: SessionKind) -> list[tuple[SessionRequested, RewardPublished]]:
        return [
            (req, self.rewards[sid]) for sid, req in self.requests.items() if req.kind is kind and sid in self.rewards
        ]

    def by_task(self) -> dict[str, dict[str, int]]:
        """Graded sessions per task id, train and eval together: sessions, resolved, errors (masked in training)."""
        out: dict[str, dict[str, int]] = {}
        for sid, rew in self.rewards.items():
            req = self.requests.get(sid)
            if req is None:
                continue
            row = out.setdefault(req.task_id, {"sessions": 0, "resolved": 0, "errors": 0})
            row["sessions"] += 1
            row["resolved"] += int(rew.resolved)
            row["errors"] += int(rew.outcome is Outcome.ERROR)
        return dict(sorted(out.items()))

    def train_solve_rate(self, rollout_step: int) -> tuple[float | None, int]:
        """Solved fraction of every graded train session requested for this rollout step, dropped groups included
        (a batch under group selection holds only groups with signal, so its own solve rate is biased)."""
        graded = [
            rew
            for req, rew in self._graded(SessionKind.TRAIN)
            if req.rollout_step == rollout_step and rew.outcome is not Outcome.ERROR
        ]
        if not graded:
            return None, 0
        return sum(r.resolved for r in graded) / len(graded), len(graded)

    def complete_rounds(self) -> list[EvalRound]:
        by_round: dict[int, list[RewardPublished]] = {}
        for req, rew in self._graded(SessionKind.EVAL):
            by_round.setdefault(int(req.metadata.get("eval_round", "0")), []).append(rew)
        out: list[EvalRound] = []
        for r in sorted(by_round):
            rewards = by_round[r]
            if len(rewards) < self.round_size:
                continue
            ok = [x for x in rewards if x.outcome is not Outcome.ERROR]
            at = next(
                int(req.metadata.get("eval_at_version", "0"))
                for req, _ in self._graded(SessionKind.EVAL)
                if int(req.metadata.get("eval_round", "0")) == r
            )
            out.append(
                EvalRound(
                    round=r,
                    at_version=at,
                    sessions=len(rewards),
                    errors=len(rewards) - len(ok),
                    solve_rate=sum(x.resolved for x in ok) / len(ok) if ok else None,
                )
            )
        return out


def _status_line(r: StepRecord) -> str:
    loss = f"{r.loss:+.4f}" if r.loss is not None else "n/a"
    train = "  n/a " if r.train_solve_rate is None else f"{100 * r.train_solve_rate:5.1f}%"
    return (
        f"step {r.step:3d}  v{r.version:<3d} train solved {train} of {r.train_sessions:3d}  batch: {r.sessions:3d} "
        f"sessions, reward {r.reward_mean:.3f} ± {r.reward_std:.3f}, {r.groups_dropped} groups dropped, "
        f"trainable {r.trainable_tokens:5d}, loss {loss}  t={r.elapsed_s:.0f}s"
    )


def _eval_line(r: EvalRound, elapsed_s: float) -> str:
    rate = "n/a" if r.solve_rate is None else f"{100 * r.solve_rate:5.1f}%"
    errors = f" ({r.errors} infrastructure errors, not counted)" if r.errors else ""
    where = "before step 1" if r.at_version == 0 else f"after step {r.at_version}"
    return f"eval round {r.round} ({where}): held-out solved {rate} of {r.sessions}{errors}  t={elapsed_s:.0f}s"


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
        "rollout_step": float(batch.step),
        "groups_dropped": batch.metrics.get("groups.dropped_zero_signal", 0.0),
    }
