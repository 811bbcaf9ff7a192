"""Protein setting: sequences, the DHFR alignment, identity splits, contacts, MI+APC, ESM-C adapter."""
import gzip

import numpy as np
import pytest
import torch

from mimdm.data import protein as pr
from mimdm.evaluation.metrics import precision_at, precision_at_L
from mimdm.models.esmc import ESMCMDM, MASK_ID
from mimdm.probing.exact import probe_mi

ALN_PATH, PDB_PATH, CHAIN = pr.dhfr_paths()


@pytest.fixture(scope="module")
def dhfr():
    with pytest.warns(UserWarning, match="dropped 10 of 4422 sequences"):
        return pr.load_alignment(ALN_PATH)


@pytest.fixture(scope="module")
def structure():
    return pr.contact_map(PDB_PATH, CHAIN)


@pytest.fixture(scope="module")
def tiny():
    return ESMCMDM.tiny(seed=0)


# ------------------------------------------------------------------ sequences
@pytest.mark.parametrize("seq, match", [
    ("MKTAXL", r"non-standard amino acid 'X' at position 4"),
    ("MKB", r"non-standard amino acid 'B' at position 2"),
    ("MK1A", r"invalid character '1' at position 2"),
    ("MKtA", r"lowercase letter 't' at position 2"),
    ("MK-A", r"gap '-' at position 2"),
    ("MK.A", r"gap '.' at position 2"),
    ("", r"empty sequence"),
    ("M_K", r"invalid character '_' at position 1"),
])
def test_validate_sequence_errors(seq, match):
    with pytest.raises(ValueError, match=match):
        pr.validate_sequence(seq)


def test_validate_sequence_accepts_and_limits():
    assert pr.validate_sequence(pr.AMINO_ACIDS) == pr.AMINO_ACIDS
    assert pr.validate_sequence("MK-A.", allow_gaps=True) == "MK-A."
    assert pr.validate_sequence("M_K", allow_mask=True) == "M_K"
    with pytest.raises(ValueError, match="length 5 exceeds the maximum 4"):
        pr.validate_sequence("MKTAL", max_len=4)
    with pytest.raises(TypeError):
        pr.validate_sequence(b"MK")
    assert pr.degap("-Ac.D--e") == "ACDE"


# ------------------------------------------------------------------ alignment files
def test_dhfr_alignment(dhfr):
    ids, seqs = dhfr
    assert len(ids) == len(seqs) == 4412 and len(dhfr.dropped) == 10
    assert {len(s) for s in seqs} == {802}
    assert all("non-standard" in why for _, why in dhfr.dropped)
    assert int(pr.match_columns(seqs).sum()) == 160
    assert ids[0] == "P0ABQ4.1"
    ms = pr.match_states(seqs)
    keep = pr.match_columns(seqs)
    assert len(ms[0]) == 160 and ms[0] == "".join(c for c, k in zip(seqs[0], keep) if k)
    assert len(pr.degap(ms[0])) == 158 and not any(c.islower() for s in ms for c in s)


def test_load_alignment_formats_and_errors(tmp_path):
    text = ">a desc\nAC-D\nef\n>b\nACxDEF\n>c\nA-CDEf\n"
    plain = tmp_path / "a.fasta"
    plain.write_text(text)
    gz = tmp_path / "a.faa.gz"
    with gzip.open(gz, "wt") as f:
        f.write(text)
    for p in (plain, gz):
        with pytest.warns(UserWarning, match="dropped 1 of 3"):
            aln = pr.load_alignment(p)
        ids, seqs = aln
        assert ids == ["a", "c"] and seqs == ["AC-Def", "A-CDEf"]
        assert aln.dropped == [("b", "non-standard letters x")]
    assert pr.match_columns(seqs).tolist() == [True] * 4 + [False] * 2
    cases = {"ragged.fa": (">a\nACD\n>b\nAC\n", "differ in length"),
             "digit.fa": (">a\nAC1\n", r"invalid character '1' at column 2"),
             "nohead.fa": ("ACD\n>a\nACD\n", "before the first '>' header"),
             "empty.fa": ("\n", "no sequences found"),
             "emptyrow.fa": (">a\n>b\nACD\n", "'a' is empty")}
    for name, (content, match) in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(ValueError, match=match):
            pr.load_alignment(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="nope.fa"):
        pr.load_alignment(tmp_path / "nope.fa")
    with pytest.raises(ValueError, match="'X' at column 1"):
        pr.encode_alignment(["AXC"])


# ------------------------------------------------------------------ clustering and splits
def test_identity_clusters_small():
    seqs = ["ACDEFGHIKL", "ACDEFGHIKV", "MNPQRSTVWY", "MNPQRSTVWA", "----FGHIKL", "WWWWWWWWWW"]
    ident = pr.pairwise_identity(seqs)
    assert ident[0, 1] == pytest.approx(0.9) and ident[0, 4] == pytest.approx(1.0)  # fragment: shorter denominator
    cl = pr.identity_clusters(seqs, 0.85)
    assert cl.tolist() == [0, 0, 1, 1, 0, 2]
    assert pr.identity_clusters(seqs, 1.0).tolist() == [0, 1, 2, 3, 0, 4]
    with pytest.raises(ValueError, match="threshold"):
        pr.identity_clusters(seqs, 0)


def test_dhfr_cluster_split_is_leak_free(dhfr):
    _, seqs = dhfr
    sp = pr.split_by_cluster(seqs, (0.8, 0.1, 0.1), threshold=0.8, seed=0)
    parts = [sp.train, sp.val, sp.test]
    allidx = np.concatenate(parts)
    assert len(allidx) == len(seqs) and len(np.unique(allidx)) == len(seqs)
    owner = [set(sp.clusters[p].tolist()) for p in parts]
    assert not (owner[0] & owner[1]) and not (owner[0] & owner[2]) and not (owner[1] & owner[2])
    assert abs(len(sp.train) / len(seqs) - 0.8) < 0.05 and len(sp.val) > 0 and len(sp.test) > 0
    # no row outside train is >= 80% identical to a train row
    ident = pr.pairwise_identity(seqs)
    assert ident[np.ix_(np.concatenate([sp.val, sp.test]), sp.train)].max() < 0.8
    same = pr.split_by_cluster(seqs, seed=0, clusters=sp.clusters)
    assert np.array_equal(same.test, sp.test)
    with pytest.raises(ValueError, match="summing to 1"):
        pr.split_by_cluster(seqs, (0.8, 0.3, 0.1), clusters=sp.clusters)
    with pytest.raises(ValueError, match="only 2 identity cluster"):
        pr.split_by_cluster(["AAAA", "AAAA", "WWWW"], threshold=0.8)


# ------------------------------------------------------------------ structure and contacts
def test_contact_map_3ql0(structure):
    seq, dist = structure
    assert len(seq) == 160 and seq.startswith("MISLIAALAVDRVIGMENAMPW")
    assert dist.shape == (160, 160) and np.allclose(dist, dist.T) and np.all(np.diag(dist) == 0)
    i, j = np.triu_indices(160, k=6)
    base = (dist[i, j] < 8).mean()
    assert 0.02 < base < 0.05
    assert 3.0 < dist[np.arange(159), np.arange(1, 160)].mean() < 7.0  # consecutive residues


def test_contact_map_errors(tmp_path):
    with pytest.raises(ValueError, match=r"chain 'B' not in 3QL0.pdb; available chains: A"):
        pr.contact_map(PDB_PATH, "B")
    with pytest.raises(FileNotFoundError, match="missing.pdb"):
        pr.contact_map(tmp_path / "missing.pdb", "A")


def test_map_to_structure_by_alignment(structure):
    sseq, _ = structure
    assert np.array_equal(pr.map_to_structure(sseq, sseq), np.arange(len(sseq)))
    deleted = sseq[:40] + sseq[45:]  # residues 40..44 missing from the model sequence
    mp = pr.map_to_structure(deleted, sseq)
    assert np.array_equal(mp[:40], np.arange(40)) and np.array_equal(mp[40:], np.arange(45, 160))
    inserted = sseq[:80] + "GWG" + sseq[80:]
    mp = pr.map_to_structure(inserted, sseq)
    assert np.array_equal(mp[:80], np.arange(80)) and (mp[80:83] == -1).all()
    assert np.array_equal(mp[83:], np.arange(80, 160))
    trunc = sseq[10:]  # numbering offset
    assert np.array_equal(pr.map_to_structure(trunc, sseq), np.arange(10, 160))


def test_contacts_for_sequence(structure):
    sseq, dist = structure
    c, ev = pr.contacts_for_sequence(sseq, PDB_PATH, CHAIN)
    sep = np.abs(np.subtract.outer(np.arange(160), np.arange(160)))
    assert np.array_equal(ev, sep >= 6) and np.array_equal(c, (dist < 8) & (sep >= 6))
    assert np.array_equal(c, c.T)
    trunc = sseq[10:]
    c2, ev2 = pr.contacts_for_sequence(trunc, PDB_PATH, CHAIN)
    assert np.array_equal(c2, c[10:, 10:])
    c_long, ev_long = pr.contacts_for_sequence(sseq, PDB_PATH, CHAIN, min_sep=24)
    assert np.array_equal(ev_long, sep >= 24) and not (c_long & ~c).any() and c_long.sum() > 0
    ins = sseq[:80] + "GWG" + sseq[80:]
    _, ev3 = pr.contacts_for_sequence(ins, PDB_PATH, CHAIN)
    assert not ev3[80:83].any() and not ev3[:, 80:83].any()


# ------------------------------------------------------------------ MI + APC, precision
def test_split_fills_every_split_and_checks_its_labels():
    seqs = ["ACDE", "FGHI", "KLMN"]
    sp = pr.split_by_cluster(seqs, clusters=[0, 1, 2])  # the greedy pass alone would put all three in train
    assert sorted([len(sp.train), len(sp.val), len(sp.test)]) == [1, 1, 1]
    sp = pr.split_by_cluster(seqs + ["PQRS"], (0.5, 0.25, 0.25), clusters=[0, 1, 1, 2])
    assert min(len(sp.train), len(sp.val), len(sp.test)) >= 1 and len(sp.train) + len(sp.val) + len(sp.test) == 4
    owner = [set(sp.clusters[p].tolist()) for p in (sp.train, sp.val, sp.test)]
    assert sum(len(o) for o in owner) == 3  # whole clusters, none split
    with pytest.raises(ValueError, match="non-negative integer labels"):
        pr.split_by_cluster(seqs, clusters=[-1, 0, 1])
    with pytest.raises(ValueError, match="non-negative integer labels"):
        pr.split_by_cluster(seqs, clusters=[0.5, 1.0, 2.0])
    with pytest.raises(ValueError, match="one label per sequence"):
        pr.split_by_cluster(seqs, clusters=[0, 1])
    with pytest.raises(ValueError, match="no sequences"):
        pr.split_by_cluster([], clusters=[])


def test_alignment_mi_equals_the_closed_form_and_checks_weights():
    # column 1 copies column 0 (two residues, 3:1), column 2 independent of both: MI(0,1) = H(col 0)
    seqs = ["AAC"] * 6 + ["AAD"] * 6 + ["CCC"] * 2 + ["CCD"] * 2
    mi = pr.alignment_mi(seqs, weights=None)
    h = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    assert mi[0, 1] == pytest.approx(h, abs=1e-9) and mi[0, 2] == pytest.approx(0.0, abs=1e-9)
    # weights: the same rows twice with weight 1/2 give the same MI; zero weight removes a row
    assert np.allclose(pr.alignment_mi(seqs + seqs, weights=np.full(32, 0.5)), mi)
    w = np.ones(16); w[12:] = 0  # drop the C rows: column 0 constant
    assert pr.alignment_mi(seqs, weights=w)[0, 1] == pytest.approx(0.0, abs=1e-12)
    # gaps=False leaves gapped pairs out: a gap in column 0 does not count as a state
    g = pr.alignment_mi(["A-C", "AAD", "-AC", "CCD"] * 5, weights=None, gaps=False)
    # pair (0, 2) over the rows without a gap: (A,C), (A,D), (C,D) equally often
    assert g[0, 2] == pytest.approx(np.log(27 / 16) / 3, abs=1e-9)
    for bad in (np.full(16, np.nan), np.zeros(16), -np.ones(16), np.ones(3)):
        with pytest.raises(ValueError, match="weights"):
            pr.alignment_mi(seqs, weights=bad)
    with pytest.raises(ValueError, match="threshold"):
        pr.sequence_weights(seqs, threshold=0)
    with pytest.raises(ValueError, match="'é' at column 1"):
        pr.alignment_mi(["AéC", "AAD"], weights=None)


def test_alignment_mi_apc_finds_planted_pair():
    rng = np.random.default_rng(0)
    N, C = 600, 12
    codes = rng.integers(0, 20, (N, C))
    codes[:, 8] = (codes[:, 3] * 7 + 1) % 20  # column 8 determined by column 3
    codes[rng.random((N, C)) < 0.05] = 20  # some gaps
    codes[:, 5] = 0  # a conserved column carries no MI
    seqs = ["".join((pr.AMINO_ACIDS + "-")[k] for k in row) for row in codes]
    for w in (None, "identity80"):
        mi = pr.alignment_mi(seqs, weights=w)
        assert mi.shape == (C, C) and np.allclose(mi, mi.T) and (mi >= 0).all() and (np.diag(mi) == 0).all()
        assert mi[5].max() < 1e-12
        s = pr.alignment_mi_apc(seqs, weights=w, pseudocount=0.1)
        top = np.unravel_index(np.argmax(np.triu(s, 1)), s.shape)
        assert tuple(int(t) for t in top) == (3, 8)
    with pytest.raises(ValueError, match="pseudocount"):
        pr.alignment_mi(seqs, pseudocount=1.0)


def test_apc_formula():
    rng = np.random.default_rng(1)
    m = rng.random((5, 5))
    m = m + m.T
    out = pr.apc(m)
    off = ~np.eye(5, dtype=bool)
    mean_i = (m * off).sum(1) / 4
    assert out[1, 3] == pytest.approx(m[1, 3] - mean_i[1] * mean_i[3] / m[off].mean())
    assert (np.diag(out) == 0).all()
    with pytest.raises(ValueError, match="square"):
        pr.apc(np.zeros((3, 4)))


def test_sequence_weights_count_neighbours_at_the_threshold():
    """1 / (rows at >= threshold identity, itself included): two copies and a 90%-identical row form one
    cluster at 80% and split at 95%; an unrelated row weighs 1."""
    seqs = ["AAAAAAAAAA", "AAAAAAAAAA", "AAAAAAAAAC", "CCCCCCCCCC"]
    assert np.allclose(pr.sequence_weights(seqs, threshold=0.8), [1 / 3, 1 / 3, 1 / 3, 1])
    assert np.allclose(pr.sequence_weights(seqs, threshold=0.95), [1 / 2, 1 / 2, 1, 1])
    assert np.allclose(pr.sequence_weights(seqs, threshold=0.9), [1 / 3, 1 / 3, 1 / 3, 1])  # identity 0.9 counts
    assert pr.sequence_weights(seqs, threshold=0.8).sum() == pytest.approx(2.0)  # N_eff


def test_precision_at_by_hand():
    """Six positions, scores and contacts placed by hand: separation window, evaluable mask, ties, L override."""
    L = 6
    scores, contacts = np.zeros((L, L)), np.zeros((L, L), dtype=bool)
    for (i, j), v, c in [((0, 2), 0.9, True), ((0, 4), 0.8, False), ((1, 3), 0.7, True), ((0, 5), 0.6, True),
                         ((2, 5), 0.5, False), ((1, 5), 0.4, True)]:
        scores[i, j], contacts[i, j] = v, c
    # separation >= 2: ranked (0,2) .9 c, (0,4) .8, (1,3) .7 c, (0,5) .6 c, (2,5) .5, (1,5) .4 c, then zeros
    assert precision_at(scores, contacts, 1, min_sep=2) == 1.0
    assert precision_at(scores, contacts, 2, min_sep=2) == 0.5
    assert precision_at(scores, contacts, 4, min_sep=2) == 0.75
    # separation in [3, 4): only (0,3), (1,4), (2,5): scores 0, 0, .5 -> top-1 is (2,5), not a contact
    assert precision_at(scores, contacts, 1, min_sep=3, max_sep=4) == 0.0
    # ties broken row-major: with every score equal the first pair is (0, 2) at separation >= 2
    assert precision_at(np.ones((L, L)), contacts, 1, min_sep=2) == 1.0
    assert precision_at(np.ones((L, L)), contacts, 2, min_sep=2) == 0.5  # (0,2) c, (0,3) not
    ev = np.ones((L, L), dtype=bool)
    ev[0, 4] = False  # (0,4) has no structure residue: out of the ranking
    assert precision_at(scores, contacts, 2, min_sep=2, evaluable_LL=ev) == 1.0
    # P@L with L overridden: length 10 -> k = 10, 5, 2 over the 10 pairs at separation >= 2
    assert precision_at_L(scores, contacts, min_sep=2, length=10) == {"P@L": 0.4, "P@L/2": 0.6, "P@L/5": 0.5}
    assert precision_at_L(scores, contacts, min_sep=2) == {"P@L": 4 / 6, "P@L/2": 2 / 3, "P@L/5": 1.0}
    with pytest.raises(ValueError, match="only 10 eligible pairs"):
        precision_at_L(scores, contacts, min_sep=2, length=11)
    nan = scores.copy()
    nan[1, 4] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        precision_at(nan, contacts, 1, min_sep=2)


def test_precision_at(structure):
    _, dist = structure
    L = len(dist)
    sep = np.abs(np.subtract.outer(np.arange(L), np.arange(L)))
    contacts = (dist < 8) & (sep >= 6)
    perfect = contacts.astype(float) + np.random.default_rng(0).random((L, L)) * 0.1
    assert precision_at_L(perfect, contacts) == {"P@L": 1.0, "P@L/2": 1.0, "P@L/5": 1.0}
    rnd = [precision_at(np.random.default_rng(s).random((L, L)), contacts, L) for s in range(20)]
    base = contacts[np.triu(sep >= 6)].mean()
    assert abs(np.mean(rnd) - base) < 0.02
    assert precision_at(-dist, contacts, L, min_sep=24) == 1.0  # closest long-range pairs are contacts
    with pytest.raises(ValueError, match="eligible pairs"):
        precision_at(perfect, contacts, 10**6)
    with pytest.raises(ValueError, match="k must be >= 1"):
        precision_at(perfect, contacts, 0)
    with pytest.raises(ValueError, match="same"):
        precision_at(perfect[:5], contacts, 3)


def test_coevolution_baseline_on_dhfr(dhfr, structure):
    """Alignment MI + APC on E. coli DHFR: precision well above the contact base rate (~0.03)."""
    ids, seqs = dhfr
    ms = pr.match_states(seqs)
    sub = ms[::4]  # a quarter of the rows keeps the test fast
    s_cc = pr.alignment_mi_apc(sub, weights=None)
    row = ms[ids.index("P0ABQ4.1")]
    seq = pr.degap(row)
    c2r = pr.column_to_residue(row)
    cols = np.nonzero(c2r >= 0)[0]
    L = len(seq)
    s_ll = np.zeros((L, L))
    s_ll[np.ix_(c2r[cols], c2r[cols])] = s_cc[np.ix_(cols, cols)]
    contacts, ev = pr.contacts_for_sequence(seq, PDB_PATH, CHAIN)
    p = precision_at_L(s_ll, contacts, evaluable_LL=ev)
    assert p["P@L"] > 0.15


# ------------------------------------------------------------------ ESM-C adapter
def test_esmc_tiny_shapes_layers_and_mask(tiny):
    assert tiny.n_values == 20 and tiny.mask_id == MASK_ID == 32 and tiny.hidden_dim == 64
    assert tiny.value_token_ids.tolist() == [5, 23, 13, 9, 18, 6, 21, 12, 15, 4, 20, 17, 14, 16, 10, 8, 11, 7, 22, 19]
    x = tiny.encode(["MKTAYIAKQR", "ACDEFGHIKL", "MK_AYI__QR"])
    out = tiny(x)
    assert out.logits.shape == (3, 10, 20) and out.hidden.shape == (3, 10, 64)
    for layer in (0, 1, 2):
        assert tiny(x, layer=layer).hidden.shape == (3, 10, 64)
    assert not torch.allclose(tiny(x, layer=1).hidden, tiny(x, layer=2).hidden)
    with pytest.raises(ValueError, match="layer must be"):
        tiny(x, layer=3)
    lp = tiny.log_probs(x)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(3, 10), atol=1e-5)
    assert tiny.is_masked(x).sum() == 3
    y = x.clone()
    y[0, 1] = MASK_ID
    assert not torch.allclose(tiny(y).logits[0], tiny(x).logits[0])  # masking changes the outputs
    z = x.clone()
    z[1, -1] = tiny.value_token_ids[0]
    assert (tiny(z).logits[1, 0] != tiny(x).logits[1, 0]).any()  # bidirectional


def test_esmc_rejects_bad_tokens():
    m = ESMCMDM.tiny(max_len=12)
    good = m.encode("MKTAYIAKQR")
    with pytest.raises(ValueError, match="exceeds the model's maximum 12"):
        m(torch.full((1, 13), 5))
    for bad_id, name in ((0, "cls"), (1, "pad"), (2, "eos"), (3, "unk"), (24, "X"), (30, "gap")):
        x = good.clone()
        x[0, 4] = bad_id
        with pytest.raises(ValueError, match=rf"token id {bad_id} at \[0, 4\] is not an amino acid"):
            m(x)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 33\)"):
        m(torch.full((1, 5), 33))
    with pytest.raises(TypeError):
        m(good.float())


def test_esmc_encode_decode(tiny):
    seqs = ["MKTAYIAKQR", "ACDEFGHIKL", "MNPQRSTVWY", "MK_AYI__QR"]
    assert tiny.decode(tiny.encode(seqs)) == seqs
    assert tiny.decode(tiny.encode(pr.AMINO_ACIDS)[0]) == [pr.AMINO_ACIDS]
    with pytest.raises(ValueError, match="equal lengths.*\\[3, 4\\]"):
        tiny.encode(["MKT", "MKTA"])
    with pytest.raises(ValueError, match="sequence 1: lowercase letter 'k' at position 1"):
        tiny.encode(["MKT", "MkT"])
    with pytest.raises(ValueError, match="non-standard amino acid 'X'"):
        tiny.encode("MXT")
    with pytest.raises(ValueError, match="exceeds the maximum 5"):
        ESMCMDM.tiny(max_len=5).encode("MKTAYI")
    with pytest.raises(ValueError, match="not an amino acid"):
        tiny.decode(torch.tensor([[5, 0, 5]]))


def test_esmc_save_load_roundtrip_and_errors(tiny, tmp_path):
    x = tiny.encode(["MKTAYIAKQR", "MK_AYI__QR"])
    path = tiny.save(tmp_path / "w" / "tiny.pth")
    arch = dict(d_model=64, n_heads=4, n_layers=2)
    loaded = ESMCMDM.load(path, **arch)
    assert not loaded.training
    assert torch.equal(loaded(x).logits, tiny(x).logits)
    # the adapter's own state_dict (keys prefixed "esmc.") loads too
    torch.save(tiny.state_dict(), tmp_path / "adapter.pt")
    assert torch.equal(ESMCMDM.load(tmp_path / "adapter.pt", **arch)(x).hidden, tiny(x).hidden)
    # a snapshot directory
    snap = tmp_path / "snap" / "data" / "weights"
    snap.mkdir(parents=True)
    (snap / "esmc_300m_2024_12_v0.pth").write_bytes(path.read_bytes())
    assert torch.equal(ESMCMDM.load(tmp_path / "snap", **arch)(x).logits, tiny(x).logits)
    with pytest.raises(ValueError, match=r"does not match the ESM-C architecture d_model=64, n_heads=4, n_layers=3 "
                                         r"\(it holds d_model=64, n_layers=2\)"):
        ESMCMDM.load(path, d_model=64, n_heads=4, n_layers=3)
    with pytest.raises(ValueError, match="it holds d_model=64"):
        ESMCMDM.load(path, d_model=32, n_heads=4, n_layers=2)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a loadable state dict"):
        ESMCMDM.load(tmp_path / "junk.pt", **arch)
    with pytest.raises(FileNotFoundError, match="nothere.pth"):
        ESMCMDM.load(tmp_path / "nothere.pth")
    with pytest.raises(FileNotFoundError, match="has no ESM-C weights file"):
        ESMCMDM.load(tmp_path / "w")


def test_esmc_300m_offline_gives_guidance(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError) as e:
        ESMCMDM.load("esmc_300m", cache_dir=tmp_path / "hf")
    msg = str(e.value)
    assert "EvolutionaryScale/esmc-300m-2024-12" in msg and str(tmp_path / "hf") in msg and "offline" in msg
    assert "ESMCMDM.load(<snapshot folder or the .pth file>)" in msg
    with pytest.raises(FileNotFoundError, match="esmc_600m"):
        ESMCMDM.load("esmc_600m")


def test_probe_mi_on_tiny_esmc(tiny):
    x = tiny.encode("MKTA__YIA_KQ")
    r = probe_mi(tiny, x)
    masked = r.masked[0]
    assert masked.sum() == 3 and int(r.nfe[0]) == 1 + 3 * 20
    mi = r.mi[0]
    assert torch.allclose(mi, mi.T) and (mi >= 0).all()
    assert (mi[~masked] == 0).all() and (mi[:, ~masked] == 0).all()
    assert mi[4, 5] > 0
    assert (r.directed[0] >= -1e-12).all()


def test_a_truncated_structure_file_is_read_with_a_warning(tmp_path):
    _, pdb_path, chain = pr.dhfr_paths()
    seq, _ = pr.contact_map(pdb_path, chain)
    lines = pdb_path.read_text().splitlines(keepends=True)
    half = tmp_path / "half.pdb"
    half.write_text("".join(lines[:len(lines) // 2]))
    with pytest.warns(UserWarning, match=r"half.pdb has no END record: the file may be truncated \(80 residues"):
        cut, _ = pr.contact_map(half, chain)
    assert len(seq) == 160 and cut == seq[:80]


def test_one_match_column_rule_with_and_without_a_residue():
    rows = ["AC-k-", "A--.-", "GD-.-"]  # column 2 all gaps, column 3 an insert, column 4 all gaps
    assert pr.match_columns(rows).tolist() == [True, True, True, False, True]
    assert pr.match_columns(rows, require_residue=True).tolist() == [True, True, False, False, False]
    assert pr.match_states(rows) == ["AC--", "A---", "GD--"]
