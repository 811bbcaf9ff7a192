import os

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _isolated_artifacts(tmp_path_factory, monkeypatch):
    """Every test writes artifacts to a temporary folder, never to the repository's cache."""
    monkeypatch.setenv("MIMDM_ARTIFACTS", str(tmp_path_factory.getbasetemp() / "artifacts"))
    yield
