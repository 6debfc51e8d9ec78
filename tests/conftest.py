"""Shared test options: ``--long`` scales the property tests up tenfold (>= 10^6 operations)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long", action="store_true", default=False,
        help="run the property tests at >= 10^6 operations",
    )


@pytest.fixture
def scale(request: pytest.FixtureRequest) -> int:
    """Multiplier for property-test sizes: 1 by default, 10 with --long."""
    return 10 if request.config.getoption("--long") else 1
