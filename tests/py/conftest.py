"""Shared pytest fixtures: the binary under test and fixture paths."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
MODELS = REPO / "tests" / "data" / "models"


def deltafin_bin():
    return os.environ.get("DELTAFIN_BIN") or str(REPO / "deltafin")


@pytest.fixture(scope="session")
def dfbin():
    b = deltafin_bin()
    if not os.path.exists(b):
        pytest.fail(f"binary {b} not built (run make)")
    return b
