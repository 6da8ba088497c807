"""floe's one bubblewrap launcher: the session runner's harnesses and the scorer's grading jobs both run through it.

``SandboxSpec`` says what one sandbox is (command, uid, environment, mounts, rlimits and cgroup limits, network,
bridge, output to keep, the seccomp filter); ``SandboxProcess`` starts it, captures its output (``Capture``), waits
with a deadline and kills its whole tree; ``run`` / ``run_sync`` do all of that in one call and return a
``SandboxResult`` (with ``limit``: which limit fired, a ``LimitHit``). ``UidPool`` hands out distinct uids to
concurrent sandboxes; ``UnixBridge`` is the host side of a sandbox's only network. What it protects against, and
what not: ``README.md``.
"""

from sandbox.bridge import UnixBridge
from sandbox.capture import Capture
from sandbox.process import SandboxProcess, SandboxResult, run, run_sync
from sandbox.spec import (
    RUN_MOUNT,
    Bind,
    Bridge,
    Identity,
    Keep,
    LimitHit,
    LimitKind,
    Limits,
    Mount,
    SandboxError,
    SandboxSpec,
    Tmpfs,
)
from sandbox.uids import UidPool

__all__ = [
    "RUN_MOUNT",
    "Bind",
    "Bridge",
    "Capture",
    "Identity",
    "Keep",
    "LimitHit",
    "LimitKind",
    "Limits",
    "Mount",
    "SandboxError",
    "SandboxProcess",
    "SandboxResult",
    "SandboxSpec",
    "Tmpfs",
    "UidPool",
    "UnixBridge",
    "run",
    "run_sync",
]
