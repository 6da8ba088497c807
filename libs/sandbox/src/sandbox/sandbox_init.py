"""In-sandbox launcher: opens the bridge on loopback, watches the caller's lifeline, then execs the command.
Stdlib only.

This file is copied into each sandbox's run directory and executed by the sandbox's python (``init_python`` of the
spec, with ``-I``), never imported by floe. The sandbox has its own network namespace with only loopback, so the
command cannot reach any TCP port of the host. Before the exec, the launcher forks one helper process that:

- with ``--bridge PORT SOCKET``: listens on ``127.0.0.1:<port>`` inside the sandbox and carries each connection over
  the Unix socket that the caller bind-mounts at SOCKET (TCP -> UDS here; UDS -> TCP on the host, see
  ``sandbox.bridge``). The listener is bound *before* the exec, so the command never races it;
- with ``--lifeline FD``: blocks on the read end of a pipe whose write end only the caller holds. EOF means the
  caller is done with the sandbox or died, and the helper then SIGKILLs every other process of the sandbox. This
  also covers the window before bwrap arms ``--die-with-parent`` (see ``sandbox.process``);
- dies with the command (``PR_SET_PDEATHSIG``), so it never keeps the sandbox alive by itself.

Usage: python3 sandbox_init.py [--lifeline FD] [--bridge PORT SOCKET] -- argv...
"""

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading

PR_SET_PDEATHSIG = 1


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def _serve(listener: socket.socket, uds_path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(uds_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _kill_sandbox() -> None:
    """SIGKILL every process of this sandbox but its init and ourselves. Only inside bwrap's pid namespace (its
    pid 1 is bwrap): run anywhere else, this must do nothing rather than signal the host's processes."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            init = os.path.basename(f.read().split(b"\0")[0])
    except OSError:
        return
    if init != b"bwrap":
        return
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, me):
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


def _helper(command_pid: int, listener: socket.socket | None, uds_path: str, lifeline: int | None) -> None:
    # Die with the command (our parent after its exec); it may already be gone by the time this is armed.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != command_pid:
        os._exit(0)
    # The helper must not hold the command's stdout/stderr open (the caller reads them to EOF).
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if listener is not None:
        threading.Thread(target=_serve, args=(listener, uds_path), daemon=True).start()
    if lifeline is None:
        threading.Event().wait()  # serve until the command exits (PDEATHSIG)
    else:
        while os.read(lifeline, 4096):
            pass  # the caller never writes; only EOF matters
        _kill_sandbox()
    os._exit(0)


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("sandbox_init: usage: [--lifeline FD] [--bridge PORT SOCKET] -- argv...")
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1 :]
    if not command:
        sys.exit("sandbox_init: empty command")
    listener: socket.socket | None = None
    uds_path = ""
    lifeline: int | None = None
    while opts:
        if opts[0] == "--bridge" and len(opts) >= 3:
            port, uds_path = int(opts[1]), opts[2]
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
            opts = opts[3:]
        elif opts[0] == "--lifeline" and len(opts) >= 2:
            lifeline = int(opts[1])
            opts = opts[2:]
        else:
            sys.exit(f"sandbox_init: unknown option {opts[0]!r}")
    if listener is not None or lifeline is not None:
        command_pid = os.getpid()
        if os.fork() == 0:
            try:
                _helper(command_pid, listener, uds_path, lifeline)
            finally:
                os._exit(0)
        if listener is not None:
            listener.close()
        if lifeline is not None:
            os.close(lifeline)  # the command itself has no use for it
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"sandbox_init: cannot exec {command[0]!r}: {exc}\n")
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
