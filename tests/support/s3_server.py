"""A real S3 server (moto) on 127.0.0.1 for the test session, spoken to over HTTP like any S3.

Registered from conftest.py with ``pytest_plugins = ["support.s3_server"]``. The server runs in a
thread of the test process; its buckets live in moto's in-process state, so a server that
is stopped and started again on the same port still holds what was written before (the
outage test relies on that).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
import pytest

from trialforge.store.objstore import ObjectStore, open_store

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class MotoServer:
    """A moto S3 endpoint that can go down and come back on the same port."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._server: ThreadedMotoServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from moto.server import ThreadedMotoServer  # imported here: it costs a second, and most sessions skip S3

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]

    def stop(self) -> None:
        """Stop serving and close the listening socket, so connections are refused as by a dead server.

        moto's stop() only ends the serve loop and leaves the socket listening (clients would hang).
        """
        if self._server is not None:
            self._server.stop()
            self._server._server.server_close()  # type: ignore[union-attr]
            self._server = None


def create_bucket(endpoint: str) -> str:
    bucket = f"tf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a moto server for the whole session; moto's test credentials are set meanwhile."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in CREDENTIALS.items():
            env.setenv(name, value)
        server = MotoServer()
        server.start()
        try:
            yield server.endpoint
        finally:
            server.stop()


@pytest.fixture
def s3_store(s3_server: str) -> ObjectStore:
    """An S3 ObjectStore under a prefix of a fresh bucket, so tests never see each other's objects."""
    return open_store(f"s3://{create_bucket(s3_server)}/data", endpoint_url=s3_server, max_attempts=2)
