"""The Hugging Face masked-LM adapter on tiny randomly initialised models built here (no network): ESM-2 through
EsmForMaskedLM and a BERT-style model, saved to a folder and loaded back as an MDM."""
import pytest
import torch

from mimdm.data.protein import AMINO_ACIDS
from mimdm.models.hf_mlm import HFMaskedLM, load_hf_masked_lm
from mimdm.probing.exact import probe_mi
from mimdm.sampling.decoding import Sequential, decode


def test_esm2_adapter_restricts_to_amino_acids_and_adds_specials(esm2_dir):
    m = load_hf_masked_lm(esm2_dir)
    assert isinstance(m, HFMaskedLM) and m.n_values == 20 and m.mask_id == 32 and m.max_len == 1024
    esm2_tokens = (esm2_dir.parent / "vocab.txt").read_text().split("\n")  # ESM-2's 33 tokens, in order
    assert m.value_token_ids.tolist() == [esm2_tokens.index(a) for a in AMINO_ACIDS]
    assert (m.prefix, m.suffix) == ([0], [2])
    x = m.encode(["MKV_A", "AC__D"])
    assert x[0, 3].item() == 32 and m.decode(x) == ["MKV_A", "AC__D"]
    out = m(x, layer=-1)
    assert out.logits.shape == (2, 5, 20) and out.hidden.shape == (2, 5, 32)
    with torch.no_grad():
        full = torch.cat([torch.zeros(2, 1, dtype=torch.long), x, torch.full((2, 1), 2)], 1)
        ref = m.hf(input_ids=full, output_hidden_states=True)
    assert torch.equal(out.logits, ref.logits[:, 1:-1][..., m.value_token_ids])
    assert torch.equal(out.hidden, ref.hidden_states[-1][:, 1:-1])
    assert torch.equal(m(x, layer=1).hidden, ref.hidden_states[1][:, 1:-1])
    with pytest.raises(ValueError, match=r"token id 24 at \[0, 1\] is not a value"):
        m(torch.tensor([[5, 24, 6]]))  # X is in ESM-2's vocabulary but not a value
    with pytest.raises(ValueError, match="'X' at position 1"):
        m.encode("MXV")
    with pytest.raises(ValueError, match="exceeds the model.s maximum 1024"):
        m(torch.full((1, 1025), 32))


def test_esm2_adapter_probes_and_decodes(esm2_dir):
    m = load_hf_masked_lm(esm2_dir)
    x = m.encode(["M___A"])
    res = probe_mi(m, x)
    assert res.nfe.item() == 1 + 3 * 20 and (res.mi >= 0).all() and torch.allclose(res.mi, res.mi.transpose(1, 2))
    dec = decode(m, x, Sequential())
    s = m.decode(dec.tokens)[0]
    assert s[0] == "M" and s[-1] == "A" and "_" not in s and dec.nfe.item() == 3


def test_bert_style_adapter(tmp_path):
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *AMINO_ACIDS]) + "\n")
    tok = BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=False)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=25, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=40)
    BertForMaskedLM(cfg).save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    m = load_hf_masked_lm(tmp_path / "bert")
    assert (m.prefix, m.suffix, m.mask_id, m.max_len) == ([2], [3], 4, 38)
    assert m.value_token_ids.tolist() == list(range(5, 25))
    out = m(m.encode("ACD_"))
    assert out.logits.shape == (1, 4, 20) and torch.isfinite(out.logits).all()


def test_missing_model_and_non_masked_tokenizer_are_clear_errors(tmp_path, monkeypatch, esm2_dir):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(FileNotFoundError, match="no Hugging Face masked LM 'facebook/esm2_t6_8M_UR50D'.*huggingface-cli download"):
        load_hf_masked_lm("facebook/esm2_t6_8M_UR50D", cache_dir=tmp_path / "empty-cache")
    from transformers import EsmForMaskedLM, EsmTokenizer

    tok = EsmTokenizer.from_pretrained(esm2_dir)
    tok.mask_token = None
    with pytest.raises(ValueError, match="has no mask token"):
        HFMaskedLM(EsmForMaskedLM.from_pretrained(esm2_dir), tok)
    with pytest.raises(ValueError, match=r"no token of its own for \['J'\]"):
        HFMaskedLM(EsmForMaskedLM.from_pretrained(esm2_dir), EsmTokenizer.from_pretrained(esm2_dir), vocab="ACJ")


def test_chapter4_loads_a_hugging_face_model_by_parameter(esm2_dir):
    from mimdm.app.profiles import get_profile
    from mimdm.pipelines.protein_zoo import FamilySpec, load_family, load_protein_model

    p = get_profile("smoke")
    fam = load_family(FamilySpec())
    m, rec = load_protein_model(f"hf:{esm2_dir}", p.protein_model, p.protein_train, fam, precision="fp32")
    assert isinstance(m, HFMaskedLM) and rec["path"] == f"hf:{esm2_dir}" and rec["n_parameters"] == m.n_parameters()
    assert 0 < rec["eval"]["val_ce"] < 2 * rec["eval"]["uniform_ce"]  # a random model: about log 20 nats
