import numpy as np
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


@pytest.fixture(scope="session")
def deadly_rectangle():
    """``(solution [81], cells [4], grid [81])``: a solution grid (seed 0) and four cells (r1,c1), (r1,c2), (r2,c1),
    (r2,c2) in two boxes of one band holding digits a, b, b, a; ``grid`` is the solution with them blanked, which has
    exactly two completions (a and b swapped)."""
    from mimdm.data import sudoku as sd

    rng = np.random.default_rng(0)
    for sol in sd.random_solutions(20, rng):
        s = sol.reshape(9, 9)
        for r1 in range(9):
            for r2 in range(r1 + 1, (r1 // 3 + 1) * 3):  # same band
                for c1 in range(9):
                    for c2 in range((c1 // 3 + 1) * 3, 9):  # another stack
                        if s[r1, c1] == s[r2, c2] and s[r1, c2] == s[r2, c1]:
                            cells = [9 * r1 + c1, 9 * r1 + c2, 9 * r2 + c1, 9 * r2 + c2]
                            grid = sol.copy()
                            grid[cells] = 0
                            return sol, cells, grid
    raise AssertionError("no deadly rectangle in 20 grids")


#: ESM-2's 33-token vocabulary, in its order (facebook/esm2_* vocab.txt).
ESM2_TOKENS = ["<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q", "N",
               "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>"]


@pytest.fixture(scope="session")
def esm2_dir(tmp_path_factory):
    """A tiny randomly initialised ESM-2 (EsmForMaskedLM, hidden 32, 2 layers; seed 0) saved with its tokenizer."""
    from transformers import EsmConfig, EsmForMaskedLM, EsmTokenizer

    d = tmp_path_factory.mktemp("esm2")
    (d / "vocab.txt").write_text("\n".join(ESM2_TOKENS) + "\n")
    tok = EsmTokenizer(str(d / "vocab.txt"))
    torch.manual_seed(0)
    cfg = EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=1026, position_embedding_type="rotary", pad_token_id=1, mask_token_id=32,
                    token_dropout=False, emb_layer_norm_before=False)
    EsmForMaskedLM(cfg).save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    return d / "model"
