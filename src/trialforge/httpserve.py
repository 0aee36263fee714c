"""What trialforge's HTTP servers share (the environment server, the inference server).

A socket bound before uvicorn starts, so port 0 works and the address is known before the first request;
uvicorn in a thread of this process for a ``with`` block; and a cap on request bodies enforced before any
byte of one is read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from trialforge.errors import ConfigError

log = logging.getLogger(__name__)


def bind(host: str, port: int, beyond_loopback: str) -> socket.socket:
    """A listening socket on ``host:port``; ``beyond_loopback`` is logged when ``host`` is not a loopback address."""
    if not _loopback(host):
        log.warning(beyond_loopback, host)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: an answer written in two parts is not held back ~40 ms by Nagle's
    # algorithm waiting on the client's delayed ACK (measured: 45 ms of a 69 ms environment step without it).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.listen(256)
    sock.set_inheritable(False)
    return sock


@contextlib.contextmanager
def in_thread(config: uvicorn.Config, sock: socket.socket, name: str) -> Iterator[str]:
    """uvicorn serving ``config``'s app on ``sock`` in a thread until the block ends; yields ``http://HOST:PORT``."""
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise ConfigError(f"the {name} did not start on {host}:{port} (its log says why)")
            thread.join(timeout=0.05)
        yield f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


class BodyCap:
    """Refuses a request body over the cap (413) before any of it is read; a body must declare its length
    (411 otherwise), so the cap holds without counting a stream. ``error`` writes the answer's JSON body."""

    def __init__(self, app: Any, max_bytes: int, error: Callable[[int, str], dict[str, Any]]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.error = error

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            declared = dict(scope.get("headers", [])).get(b"content-length")
            if declared is None or not declared.isdigit():
                return await self._refuse(send, 411, "a request body must declare its Content-Length")
            if int(declared) > self.max_bytes:
                return await self._refuse(send, 413, f"request body over {self.max_bytes} bytes")
        await self.app(scope, receive, send)

    async def _refuse(self, send: Any, status: int, message: str) -> None:
        body = json.dumps(self.error(status, message)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
