"""Shared fixtures: a private PostgreSQL server (`tests/pg.py`) for the tests of shared studies."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pg import missing_reason, private_postgres


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a throwaway PostgreSQL server on 127.0.0.1, one per test session.

    Skipped, with the reason, only where the test extra's server package cannot be installed.
    """
    reason = missing_reason()
    if reason is not None:
        pytest.skip(f"no private PostgreSQL: {reason}")
    start = time.perf_counter()
    with private_postgres() as url:
        print(f"private PostgreSQL ready in {time.perf_counter() - start:.1f} s: {url}")
        yield url
