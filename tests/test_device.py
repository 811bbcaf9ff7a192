"""Device selection, precision and batch budgets (the CUDA paths run on the device script; here the CPU and the arithmetic)."""
import pytest
import torch

from mimdm.core.device import auto_batch_tokens, tokens_for_budget
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig


def test_tokens_for_budget():
    assert tokens_for_budget(1000, 10, fraction=0.5) == 50
    assert tokens_for_budget(5, 10) == 1  # never below one token
    assert tokens_for_budget(10**15, 1.0, cap=4096) == 4096
    with pytest.raises(ValueError, match="bytes_per_token"):
        tokens_for_budget(1000, 0)
    with pytest.raises(ValueError, match="fraction"):
        tokens_for_budget(1000, 10, fraction=1.5)


def test_precision_and_cpu_batch_budget():
    model = SudokuMDM(SudokuMDMConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    assert auto_batch_tokens(model, 81, default=81 * 7) == 81 * 7  # CPU: the profile's value
    with pytest.raises(ValueError, match="precision must be"):
        model.set_precision("fp16")
    with pytest.raises(RuntimeError, match="bf16 autocast needs a CUDA device"):
        model.set_precision("bf16")
    assert model.set_precision("fp32").precision == "fp32"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_bf16_forward_returns_float32_close_to_fp32():
    model = SudokuMDM(SudokuMDMConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128)).cuda().eval()
    x = torch.full((4, 81), model.mask_id, device="cuda")
    x[:, :30] = 1
    with torch.no_grad():
        ref = model.log_probs(x)
        model.set_precision("bf16")
        out = model(x)
        lp = model.log_probs(x)
    assert out.logits.dtype == torch.float32 and out.hidden.dtype == torch.float32
    assert (lp - ref).abs().max() < 0.1
    n = auto_batch_tokens(model, 81, default=81)
    assert n >= 81 and n % 81 == 0
