import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _isolated_artifacts(tmp_path_factory, monkeypatch):
    """Every test writes artifacts to a temporary folder, never to the repository's cache."""
    monkeypatch.setenv("MIMDM_ARTIFACTS", str(tmp_path_factory.getbasetemp() / "artifacts"))
    yield


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Sudoku MDM (d=32, 2 layers; seed 0) in eval mode, shared by the decoding tests."""
    from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig

    torch.manual_seed(0)
    return SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)).eval()
