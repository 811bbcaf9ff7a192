"""Chapter 4 (protein decoding): MI maps against contacts, the protein MI head, MI-guided protein decoding.

Everything the chapter computes lives here; the family, model and structure are parameters, so the
chapter runs on any family given as alignment + structure + chain (see `mimdm.models.protein_zoo.FamilySpec`).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..artifacts import artifact_dir
from ..data import protein as pr
from ..labels import SPLITS, run_shards
from ..metrics import precision_at_L
from ..models.esmc import ESMCMDM
from ..models.protein_zoo import FamilyData, encode_values
from ..probing import probe_mi


def native_tokens(model: ESMCMDM, seq: str) -> torch.Tensor:
    """``[1, L]`` model tokens of one sequence (validated; see `ESMCMDM.encode`)."""
    return model.encode([seq]).to(model.device)


# ------------------------------------------------------------------------------------------- MI maps
def mi_map(model: ESMCMDM, seq: str, rate: float = 1.0, patterns: int = 1, delta: float = 0.0, seed: int = 0,
           batch_tokens: int = 160 * 128) -> dict:
    """Ground-truth MI map of a sequence averaged over masking patterns (probing, `mimdm.probing.probe_mi`).

    Each pattern masks a random fraction ``rate`` of the positions (all of them when ``rate`` = 1, the
    unconditional pairwise MI of the model); the map is the mean MI of each pair over the patterns in
    which both positions are masked.

    Returns:
        ``{"mi": [L, L] float64 nats (NaN for pairs never co-masked), "counts": [L, L], "nfe": passes,
        "seconds": s}``.

    Raises:
        ValueError: ``rate`` outside (0, 1], bad sequence (see `ESMCMDM.encode`).
    """
    if not 0 < rate <= 1:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    x = native_tokens(model, seq)
    L = x.shape[1]
    g = np.random.default_rng(seed)
    tot = np.zeros((L, L))
    cnt = np.zeros((L, L))
    nfe, secs = 0, 0.0
    n_pat = 1 if rate == 1 else patterns
    for _ in range(n_pat):
        m = np.ones(L, bool) if rate == 1 else g.random(L) < rate
        if m.sum() < 2:
            continue
        t = x.clone()
        t[0, torch.from_numpy(m).to(t.device)] = model.mask_id
        r = probe_mi(model, t, delta=delta, batch_tokens=batch_tokens)
        mm = np.outer(m, m)
        tot += np.where(mm, r.mi[0].cpu().numpy(), 0)
        cnt += mm
        nfe += int(r.nfe.sum())
        secs += r.seconds
    with np.errstate(invalid="ignore"):
        mi = tot / cnt
    np.fill_diagonal(mi, 0.0)
    return {"mi": mi, "counts": cnt, "nfe": nfe, "seconds": secs}


def apc_nan(matrix: np.ndarray) -> np.ndarray:
    """Average product correction (Dunn et al. 2008) over the observed (non-NaN) off-diagonal entries.

    Like `mimdm.data.protein.apc`, but row means and the overall mean ignore NaN pairs (e.g. pairs never
    masked together), which stay NaN in the result. Diagonal 0.
    """
    M = np.array(matrix, dtype=np.float64)
    np.fill_diagonal(M, np.nan)
    seen = ~np.isnan(M)
    n_row = seen.sum(1)  # a position never masked with another has no observed pair: its row mean is NaN
    row = np.divide(np.nansum(M, 1), n_row, out=np.full(len(M), np.nan), where=n_row > 0)
    overall = np.nansum(M) / seen.sum() if seen.any() else np.nan
    out = M - (np.outer(row, row) / overall if overall != 0 else 0.0)
    np.fill_diagonal(out, 0.0)
    return out


@torch.no_grad()
def categorical_jacobian(model: ESMCMDM, seq: str, rate: float = 0.5, patterns: int = 8, seed: int = 0,
                         batch_size: int = 64) -> dict:
    """Categorical Jacobian contact score (Zhang et al. 2024, *PNAS*: protein language models learn
    evolutionary statistics of interacting sequence motifs), read at masked positions.

    Substitute x_i = a at an observed position i and take the change of the logits of a position j,
    J[i, a, j, b] = logit_j,b(x with x_i = a) − logit_j,b(x); centre J over a and over b and score
    (i, j) by the Frobenius norm over (a, b). A masked-diffusion objective trains only the outputs
    of masked positions, so j is read while masked: each pattern masks a random fraction ``rate``
    of the positions and contributes the pairs (i observed, j masked); scores are averaged over
    patterns and over the two directions (NaN for pairs never covered). ``rate=0`` gives the
    classic variant with nothing masked (for models trained on unmasked outputs too, e.g. BERT-style
    80/10/10 corruption). APC (`apc_nan`) gives ``score``.

    Returns:
        ``{"score": [L, L] float64 APC-corrected, "raw": [L, L], "nfe": passes, "seconds": s}``.

    Raises:
        ValueError: ``rate`` outside [0, 1).
    """
    if not 0 <= rate < 1:
        raise ValueError(f"rate must be in [0, 1), got {rate}")
    t0 = time.perf_counter()
    x = native_tokens(model, seq)
    L, V = x.shape[1], model.n_values
    g = np.random.default_rng(seed)
    tot = np.zeros((L, L))
    cnt = np.zeros((L, L))
    nfe = 0
    for _ in range(1 if rate == 0 else patterns):
        m = np.zeros(L, bool) if rate == 0 else g.random(L) < rate
        ctx = x.clone()
        ctx[0, torch.from_numpy(m).to(x.device)] = model.mask_id
        obs = np.nonzero(~m)[0]
        if len(obs) == 0:
            continue
        base = model(ctx).logits[0].double()                          # [L, V]
        rows = ctx.repeat(len(obs) * V, 1)
        pos = torch.from_numpy(obs).to(x.device).repeat_interleave(V)
        val = torch.arange(V, device=x.device).repeat(len(obs))
        rows[torch.arange(len(obs) * V, device=x.device), pos] = model.value_token_ids[val]
        out = torch.empty(len(obs) * V, L, V, dtype=torch.float64, device=x.device)
        for s0 in range(0, len(rows), batch_size):
            out[s0:s0 + batch_size] = model(rows[s0:s0 + batch_size]).logits.double()
        nfe += 1 + len(rows)
        J = (out - base).reshape(len(obs), V, L, V)
        J = J - J.mean(1, keepdim=True)
        J = J - J.mean(3, keepdim=True)
        norm = torch.sqrt((J ** 2).sum((1, 3))).cpu().numpy()       # [n_obs, L]
        read = m if rate > 0 else np.ones(L, bool)                   # positions whose outputs are read
        tot[np.ix_(obs, np.nonzero(read)[0])] += norm[:, read]
        cnt[np.ix_(obs, np.nonzero(read)[0])] += 1
    with np.errstate(invalid="ignore"):
        directed = tot / cnt                                          # [i, j]: NaN if never covered
    both = np.stack([directed, directed.T])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        raw = np.nanmean(both, 0)
    np.fill_diagonal(raw, 0.0)
    return {"score": apc_nan(raw), "raw": raw, "nfe": nfe, "seconds": time.perf_counter() - t0}


def alignment_baseline(family: FamilyData) -> np.ndarray:
    """Alignment-column MI with APC (`mimdm.data.protein.alignment_mi_apc`, training split rows) mapped
    onto the native sequence's positions: ``[L, L]``, NaN for positions in no match column."""
    keep = pr.match_columns(family.aligned)  # match columns of the whole alignment (a subset of rows may have fewer inserts)
    A = np.frombuffer("".join(family.aligned_part("train")).encode("ascii"), dtype=np.uint8).reshape(-1, len(keep))
    M = pr.alignment_mi_apc([r.tobytes().decode("ascii") for r in A[:, keep]])
    col2res = pr.column_to_residue(family.aligned[family.native_index])[keep]      # [C] residue index or -1
    L = len(family.native)
    out = np.full((L, L), np.nan)
    ok = col2res >= 0
    idx = col2res[ok]
    out[np.ix_(idx, idx)] = M[np.ix_(np.nonzero(ok)[0], np.nonzero(ok)[0])]
    np.fill_diagonal(out, 0.0)
    return out


def contact_scores(score_LL: np.ndarray, contacts: np.ndarray, evaluable: np.ndarray) -> dict:
    """P@L, P@L/2, P@L/5 for separation ≥ 6 and ≥ 24 (long range), and AUROC over the evaluable pairs (sep ≥ 6).

    ``L`` is the sequence length; pairs with NaN scores are left out (``n_pairs`` counts the evaluated pairs).
    """
    from sklearn.metrics import roc_auc_score

    L = score_LL.shape[0]
    evaluable = evaluable & ~np.isnan(score_LL)  # pairs without a score are not evaluated
    out = {"n_pairs": int(np.triu(evaluable, 1).sum())}
    for tag, sep in (("", 6), ("long ", 24)):
        for k, v in precision_at_L(score_LL, contacts, min_sep=sep, evaluable_LL=evaluable, length=L).items():
            out[f"{tag}{k}"] = v
    iu = np.triu_indices(L, 1)
    e = evaluable[iu]
    out["AUROC"] = float(roc_auc_score(contacts[iu][e], score_LL[iu][e]))
    return out


def results_name(spec) -> str:
    """Stem of chapter 4's results file for a family: ``"protein"`` for the default family spec (DHFR
    alignment, 3QL0 chain A, default native and split), otherwise ``"protein_<alignment stem>_<structure
    stem><chain>"`` (plus ``_<native_id>`` and ``_split<digest>`` when those differ from the default), so that a
    run on another family or structure does not overwrite the committed DHFR record
    (e.g. ``halabi_alignment.fasta`` with ``3tgi.pdb`` chain E -> ``protein_halabi_alignment_3tgiE``)."""
    import hashlib
    import re

    from ..models.protein_zoo import FamilySpec

    default = FamilySpec()
    if spec == default:
        return "protein"
    aln = "dhfr" if spec.alignment == "dhfr" else Path(spec.alignment).name.split(".")[0]
    pdb = "3QL0" if spec.structure == "dhfr" else Path(spec.structure).stem
    parts = [aln, f"{pdb}{spec.chain}"]
    if spec.native_id is not None:
        parts.append(str(spec.native_id))
    split = {k: getattr(spec, k) for k in ("split_threshold", "split_fractions", "split_seed")}
    if split != {k: getattr(default, k) for k in split}:
        parts.append("split" + hashlib.sha256(repr(sorted(split.items())).encode()).hexdigest()[:6])
    return "protein_" + "_".join(re.sub(r"[^A-Za-z0-9_-]+", "-", x).strip("-") or "x" for x in parts)


# --------------------------------------------------------------------------------------- MI head labels
@dataclass(frozen=True)
class ProteinLabelConfig:
    """Protein label set: windows of family members, masked at rates in [min_mask_rate, 1], probed.

    Contexts are windows of ``window`` residues (a random offset) of sequences from the family's
    cluster split (the split of each context is its sequence's), so all contexts share one length and
    reuse the Sudoku head training code.
    """

    n_shards: int = 4
    contexts_per_shard: int = 32
    window: int = 128
    min_mask_rate: float = 0.05
    layers: tuple[int, ...] = (-1,)
    delta: float = 0.02
    batch_tokens: int | str = 128 * 256  # per forward pass; "auto": from free GPU memory
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def protein_label_shard(model: ESMCMDM, family: FamilyData, cfg: ProteinLabelConfig, shard: int) -> dict:
    """One shard of protein labels, in the format of `mimdm.labels.label_shard` (split from the family split).

    Rows are drawn uniformly from the family members with at least ``cfg.window`` residues, so each
    split's share follows the cluster split; shard 0 also holds at least one context of every split
    that has such members (when it has at least as many contexts as splits, three), so that even a
    small label set can be validated and tested.

    Raises:
        ValueError: no family member has ``cfg.window`` residues; as `mimdm.probing.probe_mi`.
    """
    rng = np.random.default_rng([cfg.seed, shard])
    where = np.zeros(len(family.seqs), dtype=np.int64)
    for code, name in enumerate(SPLITS):
        where[getattr(family.split, name)] = code
    eligible = np.array([i for i, s in enumerate(family.seqs) if len(s) >= cfg.window])
    if len(eligible) == 0:
        raise ValueError(f"no family member has at least window={cfg.window} residues")
    # a third of the contexts from each split's rows would skew training: draw rows uniformly, as the split is
    rows = rng.choice(eligible, cfg.contexts_per_shard)
    if shard == 0:  # ... but shard 0 holds every split that has eligible rows, so that a small label set (smoke)
        # still has validation and test contexts: a missing split replaces a draw of the best-represented one
        for code in range(len(SPLITS)):
            pool = eligible[where[eligible] == code]
            if len(pool) and not (where[rows] == code).any():
                counts = np.bincount(where[rows], minlength=len(SPLITS))
                if counts.max() < 2:
                    break  # fewer contexts per shard than splits
                rows[np.flatnonzero(where[rows] == counts.argmax())[-1]] = rng.choice(pool)
    vals = []
    masks = []
    for r in rows:
        s = family.seqs[r]
        off = int(rng.integers(len(s) - cfg.window + 1))
        vals.append(s[off:off + cfg.window])
        rate = rng.uniform(cfg.min_mask_rate, 1.0)
        m = rng.random(cfg.window) < rate
        m[rng.integers(cfg.window)] = True
        masks.append(m)
    v = encode_values(vals).to(model.device)
    tok = model.value_token_ids[v]
    tok[torch.from_numpy(np.stack(masks)).to(tok.device)] = model.mask_id
    res = probe_mi(model, tok, delta=cfg.delta, batch_tokens=cfg.batch_tokens)
    out = {"tokens": tok.cpu(), "mi": res.mi.float().cpu(), "asymmetry": res.asymmetry.half().cpu(),
           "entropy": res.entropy.float().cpu(), "source_id": torch.from_numpy(rows.astype(np.int64)),
           "split": torch.from_numpy(where[rows]), "kind": torch.zeros(len(rows), dtype=torch.int8),
           "nfe": res.nfe.cpu(), "seconds": torch.tensor(res.seconds)}
    with torch.no_grad():
        for layer in cfg.layers:
            out[f"hidden_{layer}"] = model(tok, layer=layer).hidden.half().cpu()
    return out


def load_or_build_protein_labels(model: ESMCMDM, model_key: str, family: FamilyData, cfg: ProteinLabelConfig,
                                 progress: bool = True) -> Path:
    """Protein label shards (resumable, manifest as `mimdm.labels.generate_labels`), cached by model and config."""
    d = artifact_dir("protein_labels", model_key, {"model": model_key, "data": family.data_id, **cfg.to_dict()})
    model.eval()
    return run_shards(d, cfg.to_dict(), cfg.n_shards, lambda k: protein_label_shard(model, family, cfg, k),
                      "probe protein labels", progress)


# ------------------------------------------------------------------------------------------- decoding
def infilling_tasks(family: FamilyData, n: int, rate_range=(0.3, 0.7), seed: int = 0, max_len: int | None = None):
    """Held-out (test split) members with a random 30-70% of positions masked.

    Returns a list of ``n`` ``(sequence, mask [L] bool)``; sequences are drawn without replacement from
    the test members of at most ``max_len`` residues.

    Raises:
        ValueError: fewer than ``n`` such test members (the message counts those over ``max_len``).
    """
    rng = np.random.default_rng(seed)
    part = family.part("test")
    test = [s for s in part if max_len is None or len(s) <= max_len]
    if len(test) < n:
        raise ValueError(f"{n} infilling tasks asked, but the test split holds {len(test)} members"
                         + (f" of at most {max_len} residues ({len(part) - len(test)} longer)" if max_len else ""))
    pick = rng.choice(len(test), n, replace=False)
    out = []
    for i in pick:
        s = test[i]
        m = rng.random(len(s)) < rng.uniform(*rate_range)
        m[rng.integers(len(s))] = True
        out.append((s, m))
    return out


def decode_grouped(model: ESMCMDM, tokens: list[torch.Tensor], rule, temperature: float, seed: int = 0):
    """Decode sequences of varying lengths with `mimdm.decoding.decode`, one length group at a time.

    Returns ``(decoded token rows in input order, nfe [N] numpy, extra passes dict summed, seconds)``.
    """
    from ..decoding import decode

    by_len: dict[int, list[int]] = {}
    for i, t in enumerate(tokens):
        by_len.setdefault(t.shape[-1], []).append(i)
    out = [None] * len(tokens)
    nfe = np.zeros(len(tokens))
    extra, secs = {}, 0.0
    for L, idx in sorted(by_len.items()):
        res = decode(model, torch.stack([tokens[i].reshape(-1) for i in idx]), rule, temperature=temperature,
                     seed=seed + L)
        for r, i in enumerate(idx):
            out[i] = res.tokens[r]
            nfe[i] = float(res.nfe[r])
        for k, v in res.extra_passes.items():
            extra[k] = extra.get(k, 0) + v
        secs += res.seconds
    return out, nfe, extra, secs


def nll_grouped(model: ESMCMDM, tokens: list[torch.Tensor], maskable: list[torch.Tensor] | None = None,
                n_samples: int = 16, seed: int = 0) -> np.ndarray:
    """Time-free I-MDCE NLL (nats, `mimdm.likelihood.time_free_nll`) of sequences of varying lengths.

    Args:
        tokens: N token rows ``[L_n]`` (no masks at scored positions).
        maskable: N bool rows, the scored set of each (None: all positions, the unconditional NLL).

    Returns:
        ``[N]`` float64 NLL estimates in nats.
    """
    from ..likelihood import time_free_nll

    by_len: dict[int, list[int]] = {}
    for i, t in enumerate(tokens):
        by_len.setdefault(t.shape[-1], []).append(i)
    out = np.zeros(len(tokens))
    for L, idx in sorted(by_len.items()):
        x = torch.stack([tokens[i].reshape(-1) for i in idx]).to(model.device)
        S = None if maskable is None else torch.stack([torch.as_tensor(maskable[i]).reshape(-1) for i in idx]).to(model.device)
        e = time_free_nll(model, x, n_samples=n_samples, maskable_BL=S, seed=seed + L)
        out[idx] = e.value.cpu().numpy()
    return out


def protein_sweep(model: ESMCMDM, tokens: list[torch.Tensor], rules, score, temperature: float, seed: int = 0,
                  progress: bool = False) -> list[dict]:
    """Decode every token row with every rule (`decode_grouped`); ``score(decoded rows) -> dict`` of quality numbers.

    Returns rows ``{"rule", "knob", "entropy_cap", "nfe" (mean passes per sequence), "head_passes", "seconds" (per
    sequence), **quality}``.
    """
    from .speedup import entropy_cap_of

    rows = []
    n = len(tokens)
    decode_grouped(model, tokens[:1], rules[0][2], temperature, seed)  # warm-up, untimed
    for name, knob, rule in tqdm(rules, desc="protein decode sweep", disable=not progress):
        out, nfe, extra, secs = decode_grouped(model, tokens, rule, temperature, seed)
        rows.append({"rule": name, "knob": knob, "entropy_cap": entropy_cap_of(rule), "nfe": float(nfe.mean()),
                     "head_passes": extra.get("head_passes", 0) / n,
                     "seconds": secs / n, **score(out)})
    return rows


def prepare(profile, spec, model_name: str | None = None, device="cpu", progress: bool = True) -> dict:
    """Everything chapter 4 trains, from the cache or built now: family, protein MDM, labels, MI head.

    Args:
        profile: a `mimdm.profiles.Profile`.
        spec: `mimdm.models.protein_zoo.FamilySpec`.
        model_name: ``"offline"``, ``"esmc_300m"`` or a weights path (None: ``profile.protein_backbone``).

    Returns:
        ``{"family", "model", "record", "labels" (Path), "head", "head_record", "head_config", "model_name"}``.
    """
    import warnings

    from ..models.protein_zoo import load_family, load_protein_model
    from .mi_head import load_or_train_head, protein_head_config_for

    name = model_name or profile.protein_backbone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fam = load_family(spec, max_len=profile.protein_model.max_len)
    model, rec = load_protein_model(name, profile.protein_model, profile.protein_train, fam, device=device, progress=progress)
    key = Path(rec["path"]).parent.name if name == "offline" else Path(str(name)).name
    labels = load_or_build_protein_labels(model, key, fam, profile.protein_labels, progress=progress)
    hcfg = protein_head_config_for(profile, model)
    head, hrec = load_or_train_head(labels, hcfg, profile.protein_head_train, model.mask_id, progress=progress, device=device)
    return {"family": fam, "model": model, "record": rec, "labels": labels, "head": head, "head_record": hrec,
            "head_config": hcfg, "model_name": name, "notes": [str(w.message) for w in caught]}
