"""The session runner of a gateway node: run unmodified agent CLIs on tasks, as GRPO samples.

``SessionNode`` consumes ``SessionRequested`` / ``SessionCancelRequested`` from Kafka and publishes each session's
``SessionStateChanged`` and ``SessionFinished``. Per session (``SessionRunner``): a private workspace from the READY
pool (``ReadyPool``), the harness preset rendered (``presets``), the CLI in a bubblewrap sandbox as an unprivileged
uid whose only network is a bridge to this node's gateway (``sandbox``, ``bridge``), the diff against the base
commit (``workspace``), and cleanup that leaves no process or directory. ``session_main`` is ``floe session``.
"""

from gateway.sessions.cli import session_main
from gateway.sessions.link import RegistryGateway
from gateway.sessions.metrics import SessionMetrics
from gateway.sessions.node import KafkaSink, NodeTopics, SessionNode
from gateway.sessions.presets import Preset, PresetError, load_preset, render
from gateway.sessions.ready_pool import PriorityGate, ReadyPool
from gateway.sessions.runner import EventSink, SessionGateway, SessionRunner, SessionStats
from gateway.sessions.sandbox import SandboxError, SandboxProcess, SandboxSpec
from gateway.sessions.settings import SessionSettings
from gateway.sessions.states import Lifecycle
from gateway.sessions.workspace import PreparedWorkspace, TaskResolver, WorkspaceError, collect_diff

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
    "RegistryGateway",
    "SandboxError",
    "SandboxProcess",
    "SandboxSpec",
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
