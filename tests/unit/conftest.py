"""Fixtures shared by the unit tier (tests/conftest.py holds the suite-wide set-up)."""

from __future__ import annotations

import pytest

from zero_kit.model import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded tokenizer, loaded once per pytest process (each xdist worker): tests only read it."""
    return load_tokenizer(None)
