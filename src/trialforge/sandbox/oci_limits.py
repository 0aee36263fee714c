"""Per-mount limits of every sandbox, and the OCI config rewrite that applies them where an engine's API cannot.

* A tmpfs of ``size`` bytes holds ``INODES_PER_MIB`` inodes per MiB of it (``disk.py`` sizes every
  place by this rule): a flood of empty files, which take no bytes, stops there.
* A sandbox's ``/dev/pts`` is a devpts instance of its own with at most ``PTYS`` terminals: the
  kernel's pool (``kernel.pty.max``, 4096 by default, 1024 of them kept for the host) is shared by
  every sandbox on the host, and one that took them all would leave none to the others.
* A container's user namespace gets its own per-user limits (``USERNS_LIMITS``). The kernel counts
  what a user namespace's users hold against the namespace's owner too, and every container Podman
  runs as root is root's: without a limit of its own, one container holding 128 inotify instances
  (``fs.inotify.max_user_instances``) left none to every other container, and none to host root.
  ``scripts/setup-system.sh`` raises root's own limits so that many containers at theirs fit.

bwrap mounts the first two itself, and each bwrap sandbox is a host uid of its own, counted alone;
Docker takes ``nr_inodes``. Podman's API refuses ``nr_inodes`` and has no say over devpts or the
namespace's limits, so trialforge's Podman runs ``runc`` through ``images/podman/oci-runtime``, which
runs this file on a container's ``config.json`` before ``runc create`` (it prints the namespace's
limits, which the wrapper sets once the container exists). It imports nothing of trialforge (it runs
under the system's Python, ``-I -S``), so the rules live here and ``disk.py`` imports them.

    python3 -I -S oci_limits.py BUNDLE/config.json
"""

from __future__ import annotations

import json
import os
import sys

INODES_PER_MIB = 128  # 32,768 files and directories in a 256 MiB quota: a large repository's checkout fits
PTYS = 16  # terminals one sandbox may hold at once (a test suite that drives a shell through one needs a few)
# /proc/sys/user/* of a container's user namespace: a host user's defaults. (Not the namespace counts: the syscall
# filter refuses nested namespaces to the sandbox, while its slirp4netns makes a mount namespace in this one.)
USERNS_LIMITS = {"max_inotify_instances": 128, "max_inotify_watches": 65536}
MIB = 1 << 20
_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def inodes_for(size_bytes: int) -> int:
    return max(1, size_bytes * INODES_PER_MIB // MIB)


def _bytes(value: str) -> int:
    value = value.strip().lower()
    if value and value[-1] in _SUFFIX:
        return int(value[:-1]) * _SUFFIX[value[-1]]
    return int(value)


def add_limits(config: dict) -> int:
    """Give every sized tmpfs mount of an OCI ``config`` its inode limit, and its devpts its terminal limit; returns
    how many mounts it changed."""
    changed = 0
    for mount in config.get("mounts") or []:
        options = mount.get("options") or []
        sizes = [o for o in options if o.startswith("size=")]
        if mount.get("type") == "tmpfs" and sizes and not any(o.startswith("nr_inodes=") for o in options):
            mount["options"] = [*options, f"nr_inodes={inodes_for(_bytes(sizes[0][len('size=') :]))}"]
        elif mount.get("type") == "devpts" and not any(o.startswith("max=") for o in options):
            mount["options"] = [*options, f"max={PTYS}"]
        else:
            continue
        changed += 1
    return changed


def main(path: str) -> None:
    """Rewrite the bundle's config, and print the user namespace's limits (``NAME VALUE`` lines) for the wrapper."""
    with open(path, encoding="utf-8") as fh:
        config = json.load(fh)
    if add_limits(config):
        tmp = f"{path}.tf-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(config, fh)
        os.replace(tmp, path)
    print("\n".join(f"{name} {value}" for name, value in USERNS_LIMITS.items()))


if __name__ == "__main__":
    main(sys.argv[1])
