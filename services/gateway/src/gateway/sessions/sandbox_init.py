"""In-sandbox launcher: opens the gateway bridge on loopback, then execs the harness. Stdlib only.

This file is copied into each session's run directory and executed by the sandbox's python (``/usr/bin/python3``),
never imported by floe. The sandbox has its own network namespace with only loopback, so the harness cannot reach
the gateway's TCP port. This launcher listens on ``127.0.0.1:<port>`` inside the sandbox and carries each
connection over the Unix socket that the node bind-mounts at ``--socket`` (TCP -> UDS here; UDS -> TCP on the node,
see ``bridge.py``). The listener is bound *before* the exec, so the harness never races it; the forwarding child
dies with the sandbox's pid namespace when the harness exits.

Usage: python3 sandbox_init.py [--bridge PORT SOCKET] -- argv...
"""

import contextlib
import os
import socket
import sys
import threading


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


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("sandbox_init: usage: [--bridge PORT SOCKET] -- argv...")
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1 :]
    if not command:
        sys.exit("sandbox_init: empty command")
    if opts[:1] == ["--bridge"]:
        port, uds_path = int(opts[1]), opts[2]
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        if os.fork() == 0:
            # The forwarder must not hold the harness's stdout/stderr open (the node reads them to EOF).
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            try:
                _serve(listener, uds_path)
            finally:
                os._exit(0)
        listener.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"sandbox_init: cannot exec {command[0]!r}: {exc}\n")
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
