"""Shared test fixtures: where the shared spec lives, and deterministic torch settings."""
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RECSTREAM_SHARED", REPO.parent / "shared"))


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
