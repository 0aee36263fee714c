"""Where a container engine listens, and how to reach it: ``sandbox.engines`` entries of params.yaml.

Three transports, as Docker's own clients have them: ``unix://`` (this host), ``tcp://`` with mutual TLS (plain tcp
accepted on loopback, warned about elsewhere: the Docker API is root on that host), and ``ssh://``, an ``ssh -N -L``
tunnel to the engine's socket with strict host keys, dying with its owner. docs/fleet.md, "Transports".
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import docker
import docker.tls
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trialforge.errors import SandboxError
from trialforge.sandbox.container.engine import API_VERSION
from trialforge.scratch import scratch_dir

log = logging.getLogger(__name__)

TUNNEL_START_S = 30.0  # ssh has this long to log in and open the forwarded socket
_PR_SET_PDEATHSIG = 1


class EngineEndpoint(BaseModel):
    """One engine of a fleet (``sandbox.engines`` in params.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str  # unix:///path/to.sock, tcp://host:port, ssh://user@host[:port]/path/to/engine.sock
    capacity: int = Field(8, ge=1)  # sandboxes placed on it at once
    name: str = ""  # how logs and the status call it (default: the url)
    tls_ca: str = ""  # tcp: the CA that signed the engine's certificate
    tls_cert: str = ""  # tcp: our client certificate and key, which the engine verifies
    tls_key: str = ""
    ssh_key: str = ""  # ssh: the identity file (default: ssh's own choice)
    ssh_known_hosts: str = ""  # ssh: the known_hosts file holding the host's key (default: the user's)

    @model_validator(mode="after")
    def _transport(self) -> EngineEndpoint:
        scheme = self.url.split("://", 1)[0] if "://" in self.url else ""
        if scheme not in ("unix", "tcp", "ssh"):
            raise ValueError(
                f"engine url {self.url!r}: use unix:///path/to.sock, tcp://host:port or ssh://user@host/path/to.sock"
            )
        tls = (self.tls_ca, self.tls_cert, self.tls_key)
        if any(tls) and (scheme != "tcp" or not all(tls)):
            raise ValueError(f"engine {self.url!r}: TLS needs a tcp:// url and all of tls_ca, tls_cert, tls_key")
        if (self.ssh_key or self.ssh_known_hosts) and scheme != "ssh":
            raise ValueError(f"engine {self.url!r}: ssh_key and ssh_known_hosts need an ssh:// url")
        if scheme == "ssh":
            parts = urlsplit(self.url)
            if not parts.hostname or not parts.username or len(parts.path) < 2:
                raise ValueError(f"engine {self.url!r}: an ssh url names user, host and the engine's socket path")
        return self

    @property
    def label(self) -> str:
        return self.name or self.url

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0]

    def tls(self) -> docker.tls.TLSConfig | None:
        if not self.tls_ca:
            return None
        for path in (self.tls_ca, self.tls_cert, self.tls_key):
            if not Path(path).is_file():
                raise SandboxError(f"engine {self.label}: TLS file {path} does not exist", cause="engine")
        return docker.tls.TLSConfig(client_cert=(self.tls_cert, self.tls_key), ca_cert=self.tls_ca, verify=True)

    def client(self, url: str | None = None, timeout: float = 120.0) -> docker.DockerClient:
        """A client for this engine, at ``url`` when a tunnel stands in for it (not yet pinged: an engine may be
        down and come back)."""
        tls = self.tls() or False
        if self.scheme == "tcp" and not tls and urlsplit(self.url).hostname not in ("127.0.0.1", "localhost", "::1"):
            log.warning("engine %s: plain tcp, no TLS: anyone on the path drives this engine as root", self.label)
        client = docker.DockerClient(base_url=url or self.url, version=API_VERSION, timeout=int(timeout), tls=tls)
        if tls:  # requests would let $REQUESTS_CA_BUNDLE replace our CA (psf/requests#3829): trust only tls_ca
            client.api.trust_env = False
        return client


class SshTunnel:
    """``ssh -N -L`` from a private unix socket here to an ``ssh://`` engine's socket; restarted when it died."""

    def __init__(self, endpoint: EngineEndpoint) -> None:
        self.endpoint = endpoint
        self._dir = scratch_dir("ssh")
        self.socket = Path(self._dir.name) / "engine.sock"
        self.log = Path(self._dir.name) / "ssh.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def argv(self) -> list[str]:
        parts = urlsplit(self.endpoint.url)
        options = {
            "BatchMode": "yes",  # never a password prompt: a key, or fail
            "StrictHostKeyChecking": "yes",  # an unknown or changed host key is refused, never learnt
            "ExitOnForwardFailure": "yes",
            "ServerAliveInterval": "5",
            "ServerAliveCountMax": "3",
            "StreamLocalBindUnlink": "yes",
        }
        if self.endpoint.ssh_known_hosts:
            options["UserKnownHostsFile"] = self.endpoint.ssh_known_hosts
        argv = ["ssh", "-N", "-T", *(f"-o{k}={v}" for k, v in options.items())]
        if self.endpoint.ssh_key:
            argv += ["-i", self.endpoint.ssh_key, "-o", "IdentitiesOnly=yes"]
        if parts.port:
            argv += ["-p", str(parts.port)]
        return [*argv, "-L", f"{self.socket}:{parts.path}", f"{parts.username}@{parts.hostname}"]

    def ensure(self) -> str:
        """The local url, the tunnel (re)started first when it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        self.socket.unlink(missing_ok=True)
        with self.log.open("wb") as log_file:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + TUNNEL_START_S
        while not self.socket.exists():
            if self.proc.poll() is not None:
                why = self.log.read_text(errors="replace").strip()
                raise SandboxError(f"ssh tunnel to {self.endpoint.label} failed: {why[-500:]}", cause="engine")
            if time.monotonic() > deadline:
                self.close_process()
                raise SandboxError(
                    f"ssh tunnel to {self.endpoint.label} not open after {TUNNEL_START_S}s", cause="engine"
                )
            time.sleep(0.02)  # poll interval while ssh logs in
        return self.url

    def close_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)

    def close(self) -> None:
        self.close_process()
        self._dir.cleanup()


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
