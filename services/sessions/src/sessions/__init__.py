"""The session runner of a gateway node: run unmodified agent CLIs on tasks, as GRPO samples.

``SessionNode`` consumes ``SessionRequested`` / ``SessionCancelRequested`` from Kafka and publishes each session's
``SessionStateChanged`` and ``SessionFinished``. Per session (``SessionRunner``): a private workspace from the READY
pool (``ReadyPool``), the harness preset rendered (``presets``), the CLI in a bubblewrap sandbox as an unprivileged
uid whose only network is a bridge to this node's gateway, the diff against the base commit (``workspace``), and
cleanup that leaves no process or directory. The sandbox is floe's one launcher, ``libs/sandbox`` (package
``sandbox``: uid drop, rlimits, lifeline, bridge, process-tree kill); ``launch`` maps ``SessionSettings`` to its
``SandboxSpec``. ``session_main`` is ``floe session``.
``sessions.gateway_node`` composes the runner with the proxy (``gateway``) into a gateway node; it is the only module
that imports both, and ``import sessions`` does not load it.
"""

from sessions.cli import session_main
from sessions.metrics import SessionMetrics
from sessions.node import KafkaSink, NodeTopics, SessionNode
from sessions.presets import Preset, PresetError, load_preset, render
from sessions.ready_pool import PriorityGate, ReadyPool
from sessions.runner import EventSink, SessionGateway, SessionRunner, SessionStats
from sessions.settings import SessionSettings
from sessions.states import Lifecycle
from sessions.workspace import PreparedWorkspace, TaskResolver, WorkspaceError, collect_diff

__all__ = [
    "EventSink",
    "KafkaSink",
    "Lifecycle",
    "NodeTopics",
    "PreparedWorkspace",
    "Preset",
    "PresetError",
    "PriorityGate",
    "ReadyPool",
    "SessionGateway",
    "SessionMetrics",
    "SessionNode",
    "SessionRunner",
    "SessionSettings",
    "SessionStats",
    "TaskResolver",
    "WorkspaceError",
    "collect_diff",
    "load_preset",
    "render",
    "session_main",
]
