"""Shared pytest fixtures: the binary under test and fixture paths."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
MODELS = REPO / "tests" / "data" / "models"
TOKENIZER_FIXTURES = SHARED / "fixtures" / "tokenizers"


def pytest_sessionstart(session):
    """The parity tests need the workplace's real tokenizers in ../shared beside the repository (CI places
    them there). Without them the run stops here with that message instead of skipping tests silently."""
    if not TOKENIZER_FIXTURES.is_dir():
        raise pytest.UsageError(f"tokenizer fixtures not found at {TOKENIZER_FIXTURES}: the tests need the shared "
                                f"folder (fixtures/tokenizers) beside the repository, as CI provides it")


def deltafin_bin():
    return os.environ.get("DELTAFIN_BIN") or str(REPO / "deltafin")


@pytest.fixture(scope="session")
def dfbin():
    b = deltafin_bin()
    if not os.path.exists(b):
        pytest.fail(f"binary {b} not built (run make)")
    return b
