"""Run a command as an unprivileged pod's container runs it under the runtime's default
seccomp profile, as far as namespaces go: ``unshare`` answers EPERM (the RuntimeDefault
profiles of containerd and Docker allow it only with CAP_SYS_ADMIN, which the preflight
drops). A seccomp filter of this process, kept across exec, so the command and its children
get the same answer, whoever they run as.

    python tests/helpers/no_unshare.py -- COMMAND [ARG...]
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM = 1
# The syscall number and audit architecture of unshare on the machines we run on.
UNSHARE = {"x86_64": (272, 0xC000003E), "aarch64": (97, 0xC00000B7)}
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
SECCOMP_DATA_NR, SECCOMP_DATA_ARCH = 0, 4


class SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def deny_unshare() -> None:
    nr, arch = UNSHARE[platform.machine()]
    program = [
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 1, 0, arch),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),  # another ABI: refuse everything
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        (BPF_JEQ_K, 0, 1, nr),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    filters = (SockFilter * len(program))(*(SockFilter(*insn) for insn in program))
    fprog = SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    deny_unshare()
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
