"""A sandbox ends with its program on either event loop a service may run: asyncio's, or uvloop's (uvicorn serves on
it when it is installed).

The two spawn differently. ``subprocess.Popen`` (asyncio's loop) closes every descriptor but the ones it is given;
libuv (uvloop's) leaves the child ends of its stdio socketpairs open beside fds 1 and 2. A sandbox with cgroup limits
forks a watcher outside its pid namespace (``sandbox.cgroup.join_argv``) that lives until the lifeline is cut, so under
uvloop that watcher held the output open: the readers saw no end-of-file, ``wait`` gave up after 5 s and the run
counted as timed out, which failed every session's diff collection.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from sandbox import run

from .conftest import Shape


async def test_a_sandbox_with_cgroup_limits_ends_with_its_program(shape: Shape, scratch: Path, uid: int) -> None:
    spec = shape(scratch, uid, ["/bin/sh", "-c", "echo out; echo err >&2"])
    spec = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, memory_bytes=512 * 1024**2, pids=64))
    res = await run(spec, timeout=30)
    assert res.cgroup_missing is None, f"this test needs the memory and pids cgroup controllers: {res.cgroup_missing}"
    assert not res.timed_out, f"on {type(asyncio.get_running_loop()).__module__}: the output never ended"
    assert res.exit_code == 0
    assert b"out" in res.stdout
