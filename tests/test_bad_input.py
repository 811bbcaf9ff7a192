"""Bad input across modules: each gets an error that names the problem, nothing is truncated."""
import numpy as np
import pytest
import torch

from mimdm.core.information import pairwise_mi
from mimdm.data import sudoku as sd
from mimdm.evaluation.likelihood import time_free_nll
from mimdm.evaluation.metrics import graph_recovery, pair_values
from mimdm.evaluation.protein_quality import fraction_above, recovery
from mimdm.models.oracle import TableJointMDM
from mimdm.pipelines.zoo import grids_to_tokens


def test_grids_to_tokens_refuses_fractions_booleans_and_a_missing_device():
    assert grids_to_tokens(np.ones((1, 81)))[0, 0].item() == 0  # whole floats are fine
    with pytest.raises(sd.SudokuError, match="whole numbers"):
        grids_to_tokens(np.full((1, 81), 1.5))
    with pytest.raises(sd.SudokuError, match="integers"):
        grids_to_tokens(np.zeros((1, 81), bool))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            grids_to_tokens(np.zeros((1, 81), np.int8), device="cuda")
    with pytest.raises(ValueError, match="not a device"):
        grids_to_tokens(np.zeros((1, 81), np.int8), device="gpu0")


def test_make_puzzle_refuses_a_fractional_number_of_tries():
    with pytest.raises(sd.SudokuError, match="max_tries must be an integer"):
        sd.make_puzzle(30, np.random.default_rng(0), max_tries=2.7)


def test_recovery_refuses_fractional_and_boolean_positions():
    assert recovery("ACD", "ACE", np.array([1, 2])) == 0.5
    with pytest.raises(ValueError, match="integer indices"):
        recovery("ACD", "ACD", [1.7])
    with pytest.raises(ValueError, match="flatnonzero"):
        recovery("ACD", "ACD", [True, False, True])


def test_fraction_above_refuses_nan():
    assert fraction_above([1.0, -np.inf, 3.0], 2.0) == pytest.approx(1 / 3)  # no hit counts as below
    with pytest.raises(ValueError, match="NaN score"):
        fraction_above([1.0, np.nan], 0.0)
    with pytest.raises(ValueError, match="threshold"):
        fraction_above([1.0], np.nan)


def test_metrics_refuse_maps_of_another_length():
    with pytest.raises(ValueError, match=r"\[4, 4\]"):
        graph_recovery(np.zeros((5, 5)), np.ones(4, bool), np.zeros((4, 4), bool))
    with pytest.raises(ValueError, match=r"\[4, 4\]"):
        graph_recovery(np.zeros((4, 4)), np.ones(4, bool), np.zeros((5, 5), bool))
    with pytest.raises(ValueError, match=r"masked_L must be \[L\]"):
        pair_values(np.zeros((4, 4)), np.ones((1, 4), bool))


def test_pairwise_mi_refuses_nan_weights():
    states = torch.tensor([[0, 0], [1, 1]])
    with pytest.raises(ValueError, match="finite"):
        pairwise_mi(states, torch.tensor([float("nan"), 1.0]), 2)


def test_nll_estimators_refuse_non_integer_counts():
    model = TableJointMDM.from_samples(torch.tensor([[0, 1], [1, 0]]), 2)
    x = torch.tensor([[0, 1]])
    for kw in ({"n_samples": 2.5}, {"n_samples": 0}, {"batch_size": 0}, {"batch_size": True}):
        with pytest.raises(ValueError, match="integer"):
            time_free_nll(model, x, **kw)


def test_sample_data_mi_needs_a_grid():
    from mimdm.probing.sudoku_mi import sample_data_mi

    with pytest.raises(ValueError, match="n_grids must be >= 1"):
        sample_data_mi(0, np.random.default_rng(0))


class _BrokenAfter:
    """Wraps a model's `_forward`: from forward pass ``n`` on, one logit of sequence 0 is ``value``."""

    def __init__(self, model, n: int, value: float, pos: int = 5, val: int = 2):
        self.inner, self.n, self.value, self.pos, self.val, self.calls = model._forward, n, value, pos, val, 0

    def __call__(self, tokens_BL, layer):
        out = self.inner(tokens_BL, layer)
        self.calls += 1
        if self.calls >= self.n:
            out.logits[0, self.pos, self.val] = self.value
        return out


def test_non_finite_model_output_is_an_error_in_decoding_probing_and_likelihood():
    from mimdm.core.contract import NonFiniteOutputError
    from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
    from mimdm.probing.exact import probe_mi
    from mimdm.sampling.decoding import Sequential, decode

    torch.manual_seed(0)
    model = SudokuMDM(SudokuMDMConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    grids = np.stack([sd.random_partial(s, 70, np.random.default_rng(0)) for s in sd.random_solutions(2, np.random.default_rng(1))])
    x = grids_to_tokens(grids)
    for value in (float("nan"), float("inf")):
        model._forward = _BrokenAfter(model, 1, value)
        with pytest.raises(NonFiniteOutputError, match=r"SudokuMDM returned non-finite logits .* at 1 positions of 1 of 2"):
            decode(model, x, Sequential("confidence"))
        with pytest.raises(NonFiniteOutputError):
            decode(model, x, Sequential("confidence"), temperature=1.0)
    # -inf is probability 0, a valid output; -inf at every value of a masked position leaves no distribution
    model._forward = _BrokenAfter(model, 1, float("-inf"))
    assert decode(model, x, Sequential("confidence")).tokens.shape == x.shape
    masked_pos = int(torch.nonzero(x[0] == model.mask_id)[0])
    model._forward = _BrokenAfter(model, 1, float("-inf"), pos=masked_pos, val=slice(None))
    with pytest.raises(NonFiniteOutputError, match="-inf at every legal value of a masked position"):
        decode(model, x, Sequential("confidence"))
    model._forward = _BrokenAfter(model, 3, float("nan"))  # NaN only from the third pass: inside probing
    with pytest.raises(NonFiniteOutputError):
        probe_mi(model, x)
    model._forward = _BrokenAfter(model, 2, float("nan"))
    with pytest.raises(NonFiniteOutputError):
        time_free_nll(model, grids_to_tokens(sd.random_solutions(1, np.random.default_rng(2))), n_samples=4, batch_size=1)
    del model._forward  # the real forward again
    assert decode(model, x, Sequential("confidence")).tokens.shape == x.shape
