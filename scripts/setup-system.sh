#!/usr/bin/env bash
# System packages trialforge needs: bubblewrap (sandboxes), debootstrap (base image), git (patches),
# podman + runc (the Docker Engine API backend and its tests), a Python with venv.
# Installs what is missing when root; otherwise says exactly what to install.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have bwrap || need+=(bubblewrap)
have debootstrap || need+=(debootstrap)
have git || need+=(git)
have podman || need+=(podman)
have runc || need+=(runc)
have chromium || need+=(chromium)  # renders the HTML report in its browser test
have python3 || need+=(python3)
ldconfig -p 2>/dev/null | grep -q "libseccomp.so.2 " || need+=(libseccomp2)  # the bwrap sandboxes' syscall filter
python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# As root, sandboxes run as this dedicated account, never as root (src/trialforge/sandbox/identity.py).
sandbox_user=${TRIALFORGE_SANDBOX_USER:-trialforge-sandbox}
ensure_sandbox_user() {
  [ "$(id -u)" = 0 ] || return 0
  getent passwd "$sandbox_user" >/dev/null && return 0
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$sandbox_user"
}
if [ ${#need[@]} -eq 0 ]; then ensure_sandbox_user; exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "trialforge needs these Debian packages: ${need[*]}" >&2
  echo "install them as root:  sudo apt-get install -y ${need[*]}" >&2
  exit 2
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
ensure_sandbox_user
