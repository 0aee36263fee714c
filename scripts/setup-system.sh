#!/usr/bin/env bash
# What trialforge needs from the system, set up idempotently on Debian/Ubuntu:
# - packages: bubblewrap (sandboxes), slirp4netns (a bwrap sandbox's own network, when a task asks
#   for one), debootstrap (base image), git (patches), podman + runc (the Docker Engine API backend
#   and its tests), uidmap (rootless Podman, for trialforge run as a normal user), chromium (the
#   report's browser test), libseccomp2 (the syscall filter), a Python with venv, gcc and the Python
#   headers (the environment-image tests compile a wheel with a C extension, as an index serves one), socat,
#   openssh-server and docker-registry (the engine-fleet tests put a Podman socket behind mutual TLS and
#   behind ssh, as a remote engine would be, and pass images through a registry; none is started here);
# - the account bwrap sandboxes run as when trialforge is root (src/trialforge/sandbox/host/identity.py);
# - subordinate ids for Podman's per-container user namespaces (UsernsMode=auto takes them from the
#   "containers" entries of /etc/subuid and /etc/subgid): uid 1000 inside a container is then a
#   high, unused host uid, never a real user; and the same for bwrap sandboxes, each of which runs as a
#   host uid of its own from the sandbox account's entries (src/trialforge/sandbox/host/idleases.py);
# - /dev/net/tun open to every user (Debian's and Ubuntu's default): a sandbox's slirp4netns runs as
#   that sandbox's own unprivileged uid and opens it (TUNSETIFF still needs rights in a namespace of its own);
# - root's inotify limits raised (/etc/sysctl.d/60-trialforge.conf): the kernel counts what every rootful
#   Podman container holds against root as well, so each container has limits of its own
#   (src/trialforge/sandbox/oci_limits.py) and root's must hold 512 containers at theirs besides its own.
# As root it does what is missing; otherwise it says exactly what is missing and exits 2.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
need=()
have bwrap || need+=(bubblewrap)
have slirp4netns || need+=(slirp4netns)
have debootstrap || need+=(debootstrap)
have git || need+=(git)
have podman || need+=(podman)
have runc || need+=(runc)
have newuidmap || need+=(uidmap)
have chromium || need+=(chromium)
have python3 || need+=(python3)
have gcc || need+=(gcc)
have socat || need+=(socat)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
have docker-registry || need+=(docker-registry)
[ -n "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)" ] \
  && [ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need+=(python3-dev)
ldconfig -p 2>/dev/null | grep -q "libseccomp.so.2 " || need+=(libseccomp2)
python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)

sandbox_user=${TRIALFORGE_SANDBOX_USER:-trialforge-sandbox}
subid_entry="containers:2147483647:2147483648"
sandbox_subid_entry="$sandbox_user:1073741824:65536"  # below Podman's range, above every user's (SUB_UID_MAX)
missing_subid=()
missing_sandbox_subid=()
for file in /etc/subuid /etc/subgid; do
  grep -q '^containers:' "$file" 2>/dev/null || missing_subid+=("$file")
  grep -q "^$sandbox_user:" "$file" 2>/dev/null || missing_sandbox_subid+=("$file")
done
getent passwd "$sandbox_user" >/dev/null && missing_user=() || missing_user=("$sandbox_user")
tun_mode=$(stat -c %a /dev/net/tun 2>/dev/null || echo 666)
sysctl_file=/etc/sysctl.d/60-trialforge.conf
inotify_wanted="fs.inotify.max_user_instances=65536 fs.inotify.max_user_watches=33554432"
low_inotify=()
for setting in $inotify_wanted; do
  key=${setting%%=*} want=${setting#*=}
  [ "$(sysctl -n "$key" 2>/dev/null || echo 0)" -ge "$want" ] || low_inotify+=("$setting")
done

if [ "$(id -u)" != 0 ]; then
  [ ${#need[@]} -eq 0 ] && [ ${#missing_subid[@]} -eq 0 ] && [ ${#missing_sandbox_subid[@]} -eq 0 ] \
    && [ ${#missing_user[@]} -eq 0 ] && [ "$tun_mode" = 666 ] && [ ${#low_inotify[@]} -eq 0 ] && exit 0
  echo "trialforge's system setup is incomplete; as root, run scripts/setup-system.sh, or by hand:" >&2
  [ ${#need[@]} -eq 0 ] || echo "  missing packages:  apt-get install -y ${need[*]}" >&2
  for file in "${missing_subid[@]}"; do
    echo "  no 'containers:' entry in $file:  echo $subid_entry >> $file" >&2
  done
  for file in "${missing_sandbox_subid[@]}"; do
    echo "  no '$sandbox_user:' entry in $file:  echo $sandbox_subid_entry >> $file" >&2
  done
  [ "$tun_mode" = 666 ] || echo "  /dev/net/tun is $tun_mode:  chmod 0666 /dev/net/tun" >&2
  [ ${#low_inotify[@]} -eq 0 ] || echo "  root's inotify limits are low:  sysctl -w ${low_inotify[*]}" >&2
  [ ${#missing_user[@]} -eq 0 ] || echo "  no sandbox account (needed when trialforge runs as root):  useradd --system" \
    "--user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin $sandbox_user" >&2
  exit 2
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for file in "${missing_subid[@]}"; do
  echo "adding $subid_entry to $file"
  echo "$subid_entry" >>"$file"
done
if [ ${#missing_user[@]} -gt 0 ]; then
  echo "creating the sandbox account $sandbox_user"
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$sandbox_user"
fi
for file in "${missing_sandbox_subid[@]}"; do
  echo "adding $sandbox_subid_entry to $file"
  echo "$sandbox_subid_entry" >>"$file"
done
if [ "$tun_mode" != 666 ] && [ -e /dev/net/tun ]; then
  echo "opening /dev/net/tun to every user (mode 0666)"
  chmod 0666 /dev/net/tun
fi
if [ ${#low_inotify[@]} -gt 0 ]; then
  echo "raising root's inotify limits: ${low_inotify[*]} ($sysctl_file)"
  printf '%s\n' "# trialforge: rootful Podman containers count against root too (scripts/setup-system.sh)" \
    "${low_inotify[@]/=/ = }" >"$sysctl_file"
  sysctl -q -w "${low_inotify[@]}"
fi
