"""The sandbox's seccomp filter: a classic-BPF program assembled here by hand (no libseccomp binding is installed).

bwrap's ``--seccomp FD`` reads a compiled program from FD: the filter array of a ``struct sock_fprog``, that is
``struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}`` records in native byte order, 8 bytes each. bwrap installs
it in the sandboxed process just before it execs the launcher, after it has built the namespaces and mounts (for
which it needs ``mount``, ``pivot_root`` and friends itself), so the filter binds the launcher and everything it
starts, never bwrap's setup. ``sandbox.process`` writes ``program()`` into a memfd and passes its fd.

What the filter does, per syscall (``struct seccomp_data``: ``int nr; u32 arch; u64 ip; u64 args[6]``):

1. ``arch`` must be the host's (``AUDIT_ARCH_X86_64`` or ``AUDIT_ARCH_AARCH64``), else the process is killed: a
   32-bit entry (``int 0x80`` on x86_64, AArch32 on arm64) has its own syscall numbers, which the table below does
   not describe, and no program of ours uses one.
2. On x86_64, an x32 syscall (``nr`` with bit 30 set, a third numbering) is killed for the same reason.
3. ``EPERM`` for what a sandboxed program has no use for and what is kernel attack surface: tracing other
   processes (``ptrace``, ``process_vm_readv/writev``), every mount API, keyrings, namespaces (``unshare``,
   ``setns``), ``bpf``, ``perf_event_open``, loading kernels and modules, ``userfaultfd`` (a classic exploit
   helper), ``acct``, swap, ``reboot``.
4. ``ENOSYS`` for ``clone3`` (its flags sit in a struct behind a pointer, which a filter cannot read; glibc and
   every runtime fall back to ``clone``, whose flags it can) and ``io_uring_setup`` (a large source of kernel bugs;
   libuv and others fall back to plain syscalls when the kernel "has no io_uring").
5. Checked arguments: ``clone`` with any namespace flag, ``socket`` for ``AF_PACKET`` or a raw ``AF_INET``/
   ``AF_INET6`` socket (``SOCK_RAW``, ``SOCK_PACKET``), and ``personality`` with anything but a query or a plain
   persona (``ADDR_NO_RANDOMIZE`` would switch ASLR off, ``READ_IMPLIES_EXEC`` makes data executable): ``EPERM``.
   Raw netlink sockets stay allowed: glibc's ``getifaddrs`` and ``getaddrinfo(AI_ADDRCONFIG)`` use them (node's
   ``os.networkInterfaces``, for one), and the sandbox's network namespace has nothing but loopback behind them.
6. Everything else: allowed. The sandbox already runs without capabilities (bwrap drops them), so most of the
   denied calls would fail anyway; the filter keeps the kernel code behind them out of reach.

32-bit arguments (``int`` domain and type, ``unsigned int`` persona) are compared on their low 32 bits only, as the
kernel reads them; ``clone``'s flags are a ``long`` but every namespace flag lies in its low word. An unknown host
architecture is refused when the program is built (``SandboxError``: set ``SandboxSpec.seccomp=False`` knowingly)
rather than run without the filter.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
from dataclasses import dataclass

from sandbox.spec import SandboxError

__all__ = ["ARCHES", "DENIED", "UNAVAILABLE", "program"]

# ---------------------------------------------------------------------------------------- the kernel's numbers

# linux/audit.h: EM_* machine | __AUDIT_ARCH_64BIT (0x80000000) | __AUDIT_ARCH_LE (0x40000000).
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# linux/seccomp.h return actions (the low 16 bits of SECCOMP_RET_ERRNO carry the errno).
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# linux/filter.h classic-BPF opcodes (class | size | mode, or class | op | source).
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20  # A = 32-bit word at offset k of seccomp_data
BPF_ALU_AND_K = 0x04 | 0x50 | 0x00  # A &= k
BPF_JEQ_K = 0x05 | 0x10 | 0x00  # A == k ? jt : jf
BPF_JGE_K = 0x05 | 0x30 | 0x00  # A >= k (unsigned) ? jt : jf
BPF_JSET_K = 0x05 | 0x40 | 0x00  # A & k ? jt : jf
BPF_RET_K = 0x06 | 0x00  # return k

# Offsets in struct seccomp_data; both supported arches are little-endian, so an argument's low word comes first.
OFF_NR = 0
OFF_ARCH = 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i


AF_INET, AF_INET6, AF_PACKET = 2, 10, 17
SOCK_RAW, SOCK_PACKET, SOCK_TYPE_MASK = 3, 10, 0xF  # the type's low bits; SOCK_NONBLOCK/SOCK_CLOEXEC are above
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET.
# (CLONE_NEWTIME, 0x80, is left out: for clone() that bit belongs to the exit signal; only clone3/unshare take it.)
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
# personality(2) values that change nothing dangerous: query (0xffffffff), PER_LINUX, PER_LINUX32 and their
# UNAME26 variants (an old-kernel version string some build scripts ask for).
PERSONALITY_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_tree_attr",
    "add_key",
    "request_key",
    "keyctl",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "userfaultfd",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
)
UNAVAILABLE = ("clone3", "io_uring_setup")  # ENOSYS: the caller falls back to an older call
_CHECKED = ("socket", "clone", "personality")

# Syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h (arm64). Numbers
# from 403 up are the same on every architecture. tests/test_attacks.py compares them with the installed headers.
_X86_64 = {
    "socket": 41,
    "clone": 56,
    "ptrace": 101,
    "personality": 135,
    "pivot_root": 155,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
}
_AARCH64 = {
    "umount2": 39,
    "mount": 40,
    "pivot_root": 41,
    "acct": 89,
    "personality": 92,
    "unshare": 97,
    "kexec_load": 104,
    "init_module": 105,
    "delete_module": 106,
    "ptrace": 117,
    "reboot": 142,
    "socket": 198,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "clone": 220,
    "swapon": 224,
    "swapoff": 225,
    "perf_event_open": 241,
    "setns": 268,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "finit_module": 273,
    "bpf": 280,
    "userfaultfd": 282,
    "kexec_file_load": 294,
}
_COMMON = {
    "io_uring_setup": 425,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "open_tree_attr": 467,  # Linux 6.15; on an older kernel the number is unused and the rule is moot
}


@dataclass(frozen=True)
class Arch:
    audit: int
    syscalls: dict[str, int]
    x32: bool  # has the x32 numbering (bit 30) to refuse


# platform.machine() -> the arch's audit value and syscall numbers.
ARCHES = {
    "x86_64": Arch(AUDIT_ARCH_X86_64, {**_X86_64, **_COMMON}, x32=True),
    "aarch64": Arch(AUDIT_ARCH_AARCH64, {**_AARCH64, **_COMMON}, x32=False),
}

# ------------------------------------------------------------------------------------------------ the assembler


@dataclass(frozen=True)
class _Insn:
    """One instruction; a jump names its targets by label (``None``: fall through to the next instruction)."""

    code: int
    k: int = 0
    jt: str | None = None
    jf: str | None = None


class _Program:
    """A list of instructions and labels; ``assemble`` turns label jumps into the 8-bit relative offsets of BPF."""

    def __init__(self) -> None:
        self._items: list[_Insn | str] = []

    def label(self, name: str) -> None:
        self._items.append(name)

    def load(self, offset: int) -> None:
        self._items.append(_Insn(BPF_LD_W_ABS, offset))

    def and_(self, k: int) -> None:
        self._items.append(_Insn(BPF_ALU_AND_K, k))

    def jump(self, code: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        self._items.append(_Insn(code, k, jt, jf))

    def ret(self, k: int) -> None:
        self._items.append(_Insn(BPF_RET_K, k))

    def assemble(self) -> bytes:
        where: dict[str, int] = {}
        insns: list[_Insn] = []
        for item in self._items:
            if isinstance(item, str):
                if item in where:
                    raise ValueError(f"label {item!r} defined twice")
                where[item] = len(insns)
            else:
                insns.append(item)
        out = bytearray()
        for pc, insn in enumerate(insns):
            # BPF jumps only forward, by an unsigned byte, counted from the next instruction.
            offsets = [0 if target is None else where[target] - pc - 1 for target in (insn.jt, insn.jf)]
            if not all(0 <= off <= 255 for off in offsets):
                raise ValueError(f"jump out of range at instruction {pc}: {offsets}")
            out += struct.pack("=HBBI", insn.code, offsets[0], offsets[1], insn.k)
        if len(insns) > 4096:  # BPF_MAXINSNS
            raise ValueError("seccomp program too long")
        return bytes(out)


# ---------------------------------------------------------------------------------------------- the program


def _build(arch: Arch) -> bytes:
    nr = arch.syscalls
    p = _Program()
    p.load(OFF_ARCH)
    p.jump(BPF_JEQ_K, arch.audit, jf="kill")
    p.load(OFF_NR)
    if arch.x32:
        p.jump(BPF_JGE_K, X32_SYSCALL_BIT, jt="kill")
    for name in DENIED:
        p.jump(BPF_JEQ_K, nr[name], jt="eperm")
    for name in UNAVAILABLE:
        p.jump(BPF_JEQ_K, nr[name], jt="enosys")
    for name in _CHECKED:
        p.jump(BPF_JEQ_K, nr[name], jt=name)
    p.ret(SECCOMP_RET_ALLOW)

    # socket(domain, type, protocol)
    p.label("socket")
    p.load(_arg_low(0))
    p.jump(BPF_JEQ_K, AF_PACKET, jt="eperm")
    p.jump(BPF_JEQ_K, AF_INET, jt="socket_type")
    p.jump(BPF_JEQ_K, AF_INET6, jt="socket_type", jf="allow")
    p.label("socket_type")
    p.load(_arg_low(1))
    p.and_(SOCK_TYPE_MASK)
    p.jump(BPF_JEQ_K, SOCK_RAW, jt="eperm")
    p.jump(BPF_JEQ_K, SOCK_PACKET, jt="eperm", jf="allow")

    # clone(flags, ...): the flags are the first argument on both arches
    p.label("clone")
    p.load(_arg_low(0))
    p.jump(BPF_JSET_K, CLONE_NAMESPACES, jt="eperm", jf="allow")

    # personality(persona)
    p.label("personality")
    p.load(_arg_low(0))
    for persona in PERSONALITY_ALLOWED:
        p.jump(BPF_JEQ_K, persona, jt="allow")
    p.ret(SECCOMP_RET_ERRNO | errno.EPERM)

    # The verdicts, last: classic BPF only jumps forward.
    p.label("allow")
    p.ret(SECCOMP_RET_ALLOW)
    p.label("kill")
    p.ret(SECCOMP_RET_KILL_PROCESS)
    p.label("eperm")
    p.ret(SECCOMP_RET_ERRNO | errno.EPERM)
    p.label("enosys")
    p.ret(SECCOMP_RET_ERRNO | errno.ENOSYS)
    return p.assemble()


@functools.cache
def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this host, ``platform.machine()``), ready for ``bwrap --seccomp``.
    ``SandboxError`` for an architecture it has no syscall table for."""
    machine = machine or platform.machine()
    arch = ARCHES.get(machine)
    if arch is None:
        raise SandboxError(
            f"no seccomp filter for architecture {machine!r} (only {', '.join(ARCHES)}): "
            "refusing to start a sandbox without one (SandboxSpec.seccomp=False runs it unfiltered)"
        )
    return _build(arch)
