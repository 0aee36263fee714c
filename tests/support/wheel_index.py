"""A package index on 127.0.0.1 for image builds in tests: a flat wheel directory served over HTTP, as pip's
``--find-links`` reads it, so a build reaches nothing past loopback. ``TEST_WHEELS`` holds the real releases that
`make test` fetched by hash (tests/fixtures/old-test-tools.txt)."""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

TEST_WHEELS = Path(__file__).resolve().parents[2] / ".cache" / "test-wheels"  # Makefile: TEST_WHEELS


def copy_test_wheels(dest: Path) -> None:
    """The real releases `make test` fetched by hash, into ``dest`` (an index's directory)."""
    for wheel in TEST_WHEELS.glob("*.whl"):
        shutil.copy(wheel, dest)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving(wheels: Path) -> Iterator[str]:
    """``wheels`` served on 127.0.0.1 for as long as the block runs: the index's URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(wheels)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serving_test_wheels(root: Path) -> Iterator[str]:
    """The real releases `make test` fetched, copied into ``root`` and served on 127.0.0.1: the index's URL (the
    test fails, saying how to fetch them, where they are missing)."""
    if not (TEST_WHEELS / ".fetched").is_file():
        pytest.fail(f"{TEST_WHEELS} is missing: `make test` fetches tests/fixtures/old-test-tools.txt there")
    copy_test_wheels(root)
    with serving(root) as url:
        yield url
