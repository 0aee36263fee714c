"""A real OpenAI-compatible chat endpoint on 127.0.0.1 that plays a script, for the policy tests.

Registered as a pytest plugin (``pytest_plugins = ["support.chat_server"]`` in a test module or conftest.py).
``POST /v1/chat/completions`` answers with the next scripted item: a completion body (see
``tool_call`` and ``text_reply``) or a ``Fault``: an HTTP error status, or a hang that outlasts the
client's timeout; or, for concurrent episodes whose requests interleave, what a function of the request
answers (``answer_with``). Every request body is kept, in order, for the test to inspect.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass(frozen=True)
class Fault:
    """An HTTP error ``status`` saying ``message``; with ``hang_s``, answered only after that long (or when the
    server stops)."""

    status: int = 500
    hang_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "scripted fault"


_ids = itertools.count(1)


def completion(message: dict[str, Any], finish_reason: str, logprobs: list[float] | None, usage: tuple[int, int]):
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": f"t{i}", "logprob": lp} for i, lp in enumerate(logprobs)]}
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [choice],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def tool_call(
    name: str,
    args: dict[str, Any] | None = None,
    *,
    arguments: str | None = None,
    logprobs: list[float] | None = None,
    usage: tuple[int, int] = (100, 20),
) -> dict[str, Any]:
    """A completion whose reply calls ``name``; ``arguments`` gives the raw argument text instead of ``args``."""
    call = {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments if arguments is not None else json.dumps(args or {})},
    }
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return completion(message, "tool_calls", logprobs, usage)


def text_reply(content: str, usage: tuple[int, int] = (100, 20)) -> dict[str, Any]:
    return completion({"role": "assistant", "content": content}, "stop", None, usage)


class ChatServer:
    def __init__(self) -> None:
        self.script: deque[dict[str, Any] | Fault] = deque()
        self.responder: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's headers, in the same order
        self._release = threading.Event()  # ends every hang when the server stops
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="chat-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def play(self, *items: dict[str, Any] | Fault) -> None:
        self.script.extend(items)

    def answer_with(self, responder: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        """Answer every request with ``responder(request body)`` instead of the script (None: the script again)."""
        self.responder = responder

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                if server.responder is not None:
                    return self._send(200, server.responder(body))
                if not server.script:
                    return self._send(400, {"error": {"message": "the test's script is exhausted"}})
                item = server.script.popleft()
                if isinstance(item, Fault):
                    if item.hang_s:
                        server._release.wait(item.hang_s)
                    return self._send(item.status, {"error": {"message": item.message}}, item.headers)
                return self._send(200, item)

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a hang past its timeout): nothing to answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    server = ChatServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
