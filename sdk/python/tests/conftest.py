"""Fixtures for the forkd SDK tests.

Tests marked by the ``client`` fixture need a real daemon: start one with

    eval "$(scripts/sdk-test-env.sh start py)"

which exports FORKD_SOCKET, FORKD_TEST_TAG (busybox snapshot: exec, files,
branch) and FORKD_TEST_PY_TAG (Python snapshot: run_code). Without
FORKD_TEST_TAG those tests are skipped; the offline tests (a fake daemon
in this process) always run.
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import Callable, Iterator, List

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import forkd  # noqa: E402

NEEDS_DAEMON = (
    "FORKD_TEST_TAG is unset: these tests need a forkd daemon; "
    'run `eval "$(scripts/sdk-test-env.sh start py)"` first'
)


@pytest.fixture(scope="session")
def test_tag() -> str:
    tag = os.environ.get("FORKD_TEST_TAG")
    if not tag:
        pytest.skip(NEEDS_DAEMON)
    return tag


@pytest.fixture(scope="session")
def py_tag(test_tag: str) -> str:
    tag = os.environ.get("FORKD_TEST_PY_TAG")
    if not tag:
        pytest.skip("FORKD_TEST_PY_TAG is unset: run_code tests need a snapshot with a Python session")
    return tag


@pytest.fixture(scope="session")
def client(test_tag: str) -> Iterator[forkd.Client]:
    c = forkd.Client()
    yield c
    c.close()


@pytest.fixture
def sandbox(client: forkd.Client, test_tag: str) -> Iterator[forkd.Sandbox]:
    """A fresh busybox sandbox, killed after the test."""
    sb = forkd.Sandbox.create(test_tag, client=client, metadata={"suite": "sdk-python"})
    yield sb
    sb.kill()


@pytest.fixture(scope="module")
def py_sandbox(client: forkd.Client, py_tag: str) -> Iterator[forkd.Sandbox]:
    """A Python sandbox shared by a test module (run_code state persists).
    It outlives the default five minutes on a slow machine: an hour."""
    sb = forkd.Sandbox.create(py_tag, client=client, metadata={"suite": "sdk-python"}, timeout=3600)
    yield sb
    sb.kill()


@pytest.fixture
def new_tag(client: forkd.Client) -> Iterator[Callable[[], str]]:
    """Makes unique snapshot tags; deletes whichever exist after the test."""
    made: List[str] = []

    def make() -> str:
        t = "sdkpy-%s" % secrets.token_hex(4)
        made.append(t)
        return t

    yield make
    for t in reversed(made):
        try:
            client.snapshots.delete(t, cascade=True)
        except forkd.NotFound:
            pass
        except forkd.ForkdError:
            try:
                client.snapshots.delete(t)
            except forkd.ForkdError:
                pass
