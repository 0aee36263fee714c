"""The syscall filter every sandbox runs under, built with libseccomp (through ``pyseccomp``).

A denylist mirroring what Docker's default profile keeps from containers, plus io_uring and the ptrace family; each
entry says why. A listed call fails with EPERM (ENOSYS for ``clone3``); other ABIs (i386, x32) kill the process.
Two renderings of the same rules: BPF handed to bwrap as an fd (``--seccomp``), and an OCI profile for the docker
backend. docs/security.md, the "kernel attack surface" row of "What holds, by construction".
"""

from __future__ import annotations

import errno
import os
import tempfile
from functools import cache

from trialforge.errors import SandboxError

# syscall -> why a sandbox must not have it
DENIED: dict[str, str] = {
    # kernel and machine state
    "reboot": "reboots the machine",
    "kexec_load": "loads a new kernel",
    "kexec_file_load": "loads a new kernel",
    "init_module": "loads kernel code",
    "finit_module": "loads kernel code",
    "delete_module": "unloads kernel code",
    "create_module": "loads kernel code (obsolete)",
    "query_module": "kernel module introspection (obsolete)",
    "get_kernel_syms": "kernel symbol table (obsolete)",
    "swapon": "host swap configuration",
    "swapoff": "host swap configuration",
    "acct": "process accounting to a host file",
    "syslog": "reads or clears the kernel log",
    "_sysctl": "writes kernel parameters (obsolete interface)",
    "sysfs": "filesystem type introspection (obsolete)",
    "ustat": "filesystem statistics (obsolete)",
    "uselib": "loads a shared library the old way (obsolete)",
    "nfsservctl": "kernel NFS server (obsolete)",
    "lookup_dcookie": "profiling interface",
    "quotactl": "host disk quotas",
    "quotactl_fd": "host disk quotas",
    "vhangup": "hangs up the terminal",
    "iopl": "raw I/O port access",
    "ioperm": "raw I/O port access",
    "vm86": "virtual 8086 mode",
    "vm86old": "virtual 8086 mode",
    # time
    "settimeofday": "sets the host clock",
    "clock_settime": "sets the host clock",
    "clock_adjtime": "adjusts the host clock",
    "adjtimex": "adjusts the host clock",
    "stime": "sets the host clock (obsolete)",
    # keys, BPF, profiling
    "add_key": "kernel keyrings are not namespaced",
    "request_key": "kernel keyrings are not namespaced",
    "keyctl": "kernel keyrings are not namespaced",
    "bpf": "loads BPF programs into the kernel",
    "perf_event_open": "performance counters leak host activity and are a frequent kernel attack surface",
    "userfaultfd": "a classic kernel-exploit primitive (race widening)",
    "io_uring_setup": "io_uring bypasses syscall filtering and is a frequent kernel attack surface",
    "io_uring_enter": "io_uring bypasses syscall filtering",
    "io_uring_register": "io_uring bypasses syscall filtering",
    "fanotify_init": "watches host filesystems",
    # other processes
    "ptrace": "inspects or controls other processes",
    "process_vm_readv": "reads another process's memory",
    "process_vm_writev": "writes another process's memory",
    "kcmp": "compares other processes' kernel objects",
    "pidfd_getfd": "steals another process's file descriptors",
    # namespaces and mounts (bwrap sets all of these up before the filter is installed)
    "unshare": "new namespaces (user namespaces are kernel attack surface)",
    "setns": "joins other namespaces",
    "mount": "mounts filesystems",
    "umount": "unmounts filesystems",
    "umount2": "unmounts filesystems",
    "pivot_root": "changes the root filesystem",
    "chroot": "changes the root directory",
    "move_mount": "mount API",
    "open_tree": "mount API",
    "fsopen": "mount API",
    "fsconfig": "mount API",
    "fsmount": "mount API",
    "fspick": "mount API",
    "mount_setattr": "mount API",
    "name_to_handle_at": "file handles open files by inode, around path checks",
    "open_by_handle_at": "file handles open files by inode, around path checks (the 'shocker' escape)",
    # memory policy
    "set_mempolicy": "NUMA placement needs CAP_SYS_NICE in Docker's profile",
    "mbind": "NUMA placement needs CAP_SYS_NICE in Docker's profile",
    "move_pages": "moves other processes' pages",
}

# clone() flags that create namespaces: refused (no nested sandbox inside the sandbox)
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# personality() flags that weaken the process's own hardening
PERSONALITY_FLAGS = {
    "ADDR_NO_RANDOMIZE": 0x0040000,  # turns ASLR off
    "MMAP_PAGE_ZERO": 0x0100000,  # maps page 0: null-dereference exploits
    "ADDR_COMPAT_LAYOUT": 0x0200000,
    "READ_IMPLIES_EXEC": 0x0400000,  # executable data pages
}
# ioctl() requests that push input into, or reconfigure, the controlling terminal. The kernel takes the request
# as a 32-bit int, so ``0x100005412`` is TIOCSTI too: the rules compare the low 32 bits only (REQUEST_MASK).
TERMINAL_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
REQUEST_MASK = 0xFFFFFFFF


def rules() -> list[tuple[str, int, list[tuple[int, int]]]]:
    """Every rule as (syscall, errno, [(argument index, flag)...]); a flag matches when all its bits are set."""
    listed: list[tuple[str, int, list[tuple[int, int]]]] = [(name, errno.EPERM, []) for name in DENIED]
    listed.append(("clone3", errno.ENOSYS, []))  # its flags live in memory, out of a filter's reach
    listed += [("clone", errno.EPERM, [(0, flag)]) for flag in CLONE_NAMESPACE_FLAGS.values()]
    listed += [("personality", errno.EPERM, [(0, flag)]) for flag in PERSONALITY_FLAGS.values()]
    listed += [("ioctl", errno.EPERM, [(1, request)]) for request in TERMINAL_IOCTLS.values()]
    return listed


def _condition(name: str, flag: int) -> tuple[int, int]:
    """(mask, value) an argument must equal under the mask: an ioctl request's low 32 bits, else a flag's bits."""
    return (REQUEST_MASK, flag) if name == "ioctl" else (flag, flag)


def oci_profile() -> dict:
    """The rules as an OCI/Docker seccomp profile (what ``--security-opt seccomp=...`` takes)."""
    syscalls = []
    for name, err, args in rules():
        entry: dict = {"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": err}
        if args:  # SCMP_CMP_MASKED_EQ: ``value`` is the mask, ``valueTwo`` what the masked argument must be
            entry["args"] = [
                {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}
                for index, (mask, value) in ((i, _condition(name, flag)) for i, flag in args)
            ]
        syscalls.append(entry)
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"], "syscalls": syscalls}


@cache
def filter_bpf() -> bytes:
    """The compiled filter (BPF bytecode in the kernel's format), built once per process."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # OSError: libseccomp.so.2 itself is missing
        raise SandboxError(f"cannot load libseccomp ({exc}): apt-get install libseccomp2", cause="seccomp") from exc
    filt = sc.SyscallFilter(sc.ALLOW)
    for name, err, args in rules():
        conditions = [sc.Arg(i, sc.MASKED_EQ, *_condition(name, flag)) for i, flag in args]
        try:
            filt.add_rule(sc.ERRNO(err), name, *conditions)
        except (ValueError, RuntimeError, OSError):
            continue  # not a syscall on this architecture (e.g. vm86 on x86_64): nothing to deny
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_fd() -> int:
    """A fresh readable fd holding the filter (bwrap consumes one per sandboxed command); the caller closes it."""
    fd = os.memfd_create("trialforge-seccomp", os.MFD_CLOEXEC)
    os.write(fd, filter_bpf())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
