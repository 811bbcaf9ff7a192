"""Run profiles: ``smoke`` (CI, minutes), ``cpu`` (the default main job on 2 cores), ``paper`` (GPU, paper scale).

A profile is data, not code: each chapter reads the settings it needs from `get_profile` and
records the whole profile in its results file, so a number in the book can be traced to the
settings that produced it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mimdm.data.curriculum import CurriculumConfig
from mimdm.experiments.protein import AlignedLabelConfig, ProteinLabelConfig
from mimdm.heads.mi_head import HeadTrainConfig
from mimdm.models.potts import PottsMDMConfig
from mimdm.models.sudoku import SudokuMDMConfig
from mimdm.models.training import TrainConfig
from mimdm.pipelines.labels import LabelConfig
from mimdm.pipelines.long_run import relation24_run_configs
from mimdm.pipelines.protein_zoo import ProteinMDMConfig


@dataclass(frozen=True)
class Profile:
    """Settings of one run of the study.

    Attributes:
        name: ``smoke`` | ``cpu`` | ``paper``.
        sudoku_model: architecture of the Sudoku MDM.
        sudoku_train: its training settings.
        sudoku_curriculum: its puzzle-mask curriculum (`mimdm.data.curriculum`), None for random masks only.
        sudoku_first_stage: for a model trained in two warmup-stable-decay cycles (``sudoku_train.cycle_start`` > 0),
            the first cycle's training config and curriculum (`mimdm.pipelines.zoo.load_or_train_sudoku_mdm`).
        solve_eval_puzzles: number of 30-35-clue unique puzzles used to measure the solve rate.
        probe_contexts: contexts per masking level in the ground-truth MI chapter.
        probe_batch_tokens: token budget of one probing forward (batch size x length): the
            memory budget of probing.
        enum_contexts: partial grids whose completions are enumerated for the true data MI.
        enum_clues: clue counts of those grids (under-determined: several completions).
        max_completions: bound of the completion enumeration.
        reference_grids: random solution grids for the Monte Carlo empty-grid reference MI.
        prune_deltas: top-value pruning thresholds compared in the probing-cost section.
        labels: the MI-head label set (contexts, probing, stored hidden layers).
        head_hidden, head_rank: MI head widths (`mimdm.heads.mi_head.MIHeadConfig`).
        head_arch: other `mimdm.heads.mi_head.MIHeadConfig` fields of the Sudoku MI head (e.g. ``{"pairs": "bilinear",
            "channels": 8}``); empty: the defaults (the gathered pair network).
        head_train: MI head training settings.
        ablation_layers: hidden layers compared in the layer ablation (each must be in ``labels.layers``).
        ablation_epochs: epochs of each ablation head.
        agreement_contexts: under-determined grids compared with the true data MI in chapter 3.
        hard_puzzles: size of the held-out hard-puzzle test set (chapter 5), on which the settings chosen on
            ``dev_puzzles`` other hard puzzles are reported (`mimdm.experiments.speedup.hard_puzzle_split`).
        hard_clues: clue range of the hard puzzles.
        generation_contexts: size of the generation set; ``generation_max_clues`` its most clues.
        oracle_puzzles: hard puzzles also decoded with the probing oracle (expensive).
        likelihood_sequences: grids (and grid pairs) in the estimator-variance study (chapter 6).
        likelihood_draws: mask draws K per estimate there; ``likelihood_repeats`` independent estimates.
        likelihood_contexts: generation contexts decoded by each rule in chapter 6.
        nll_draws: mask draws per decoded grid when NLL scores decoding (chapters 5 and 6).
        protein_backbone: the chapter-4 model: ``"potts"`` (the aligned-column Potts MDM, trained here),
            ``"offline"`` (a small ESM-C-architecture MDM on de-gapped sequences, trained here), ``"esmc_300m"``
            or an ESM-C weights path.
        potts, potts_train: the aligned-column Potts MDM (`mimdm.models.potts`) and its training.
        plm, plm_train: the pseudo-likelihood Potts baseline (the same model, one masked column per row).
        potts_l2_grid, plm_l2_grid: L2 penalties tried for each; each keeps the one with the lowest validation CE.
        aligned_labels, aligned_head_train: the label set of the Potts MDM's MI heads and their training.
        protein_model, protein_train: the offline protein MDM (ESM-C blocks) and its training (chapter 4).
        protein_labels, protein_head_train: the protein MI head's label set and training;
            ``protein_head_hidden``/``protein_head_rank`` its widths (paper: ~810K parameters on ESM-C 300M).
        protein_mi_rates, protein_mi_rate_patterns: aligned model: masking rates of the reference row whose probed
            MI maps are scored, and random patterns at each (enough that every pair is masked together);
        protein_mi_patterns: raw-sequence models: masking patterns (at rate 0.5) averaged in the conditional MI map;
            ``protein_mi_delta`` its top-value pruning.
        protein_infill, protein_generate: held-out members infilled / sequences generated per rule setting.
    """

    name: str
    sudoku_model: SudokuMDMConfig
    sudoku_train: TrainConfig
    sudoku_curriculum: CurriculumConfig | None = None
    sudoku_first_stage: tuple[TrainConfig, CurriculumConfig | None] | None = None
    solve_eval_puzzles: int = 200
    probe_contexts: int = 8
    probe_batch_tokens: int = 81 * 512
    enum_contexts: int = 12
    enum_clues: tuple[int, int] = (24, 28)
    max_completions: int = 100_000
    reference_grids: int = 200_000
    prune_deltas: tuple[float, ...] = (0.0, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2)
    labels: LabelConfig = LabelConfig()
    head_hidden: int = 224
    head_rank: int = 64
    head_arch: dict = field(default_factory=dict)
    head_train: HeadTrainConfig = HeadTrainConfig()
    ablation_layers: tuple[int, ...] = (1, 3, -1)
    ablation_epochs: int = 10
    agreement_contexts: int = 12
    hard_puzzles: int = 300
    dev_puzzles: int = 100
    hard_clues: tuple[int, int] = (24, 26)
    generation_contexts: int = 200
    generation_max_clues: int = 5
    oracle_puzzles: int = 20
    likelihood_sequences: int = 32
    likelihood_draws: int = 32
    likelihood_repeats: int = 8
    likelihood_contexts: int = 100
    nll_draws: int = 16
    protein_backbone: str = "potts"
    potts: PottsMDMConfig = PottsMDMConfig()
    potts_train: TrainConfig = TrainConfig(steps=600, batch_size=512, lr=0.01, warmup=20, weight_decay=0.0,
                                           ckpt_every=50, log_every=25)
    plm: PottsMDMConfig = PottsMDMConfig(masking="one", val_rates=(0.15,))
    plm_train: TrainConfig = TrainConfig(steps=600, batch_size=512, lr=0.01, warmup=20, weight_decay=0.0,
                                         ckpt_every=50, log_every=25)
    potts_l2_grid: tuple[float, ...] = (0.01, 0.03, 0.1)
    plm_l2_grid: tuple[float, ...] = (0.1,)
    aligned_labels: AlignedLabelConfig = AlignedLabelConfig()
    # the Potts MDM's probed MI is ~10x smaller than Sudoku's (median 0.001 nats per masked pair): the loss scales
    # follow, else the head collapses to zero MI (measured: validation loss flat from epoch 2, test Pearson 0.16)
    aligned_head_train: HeadTrainConfig = HeadTrainConfig(epochs=40, batch_size=16, lr=3e-3, loss_scale=0.001,
                                                          loss_weight_scale=0.005)
    protein_model: ProteinMDMConfig = ProteinMDMConfig()
    protein_train: TrainConfig = TrainConfig(steps=1500, batch_size=32, lr=1e-3, warmup=100)
    protein_labels: ProteinLabelConfig = ProteinLabelConfig()
    protein_head_train: HeadTrainConfig = HeadTrainConfig(epochs=30, batch_size=16)
    protein_head_hidden: int = 224
    protein_head_rank: int = 64
    protein_mi_patterns: int = 8
    protein_mi_rates: tuple[float, ...] = (1.0, 0.5, 0.15)
    protein_mi_rate_patterns: tuple[int, ...] = (1, 16, 128)
    protein_mi_delta: float = 0.02
    protein_infill: int = 24
    protein_generate: int = 24
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


_RUN_MODEL, _RUN_TRAIN, _RUN_CURRICULUM = relation24_run_configs()

PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        name="smoke",
        sudoku_model=SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64),
        sudoku_train=TrainConfig(steps=60, batch_size=32, warmup=10, ckpt_every=30, log_every=10),
        solve_eval_puzzles=10,
        probe_contexts=2,
        enum_contexts=3,
        enum_clues=(28, 30),
        max_completions=20_000,
        reference_grids=20_000,
        prune_deltas=(0.0, 1e-2, 0.1),
        labels=LabelConfig(n_shards=2, sources_per_shard=10, contexts_per_source=3, layers=(-1, 1)),
        head_hidden=32,
        head_rank=16,
        head_train=HeadTrainConfig(epochs=3),
        ablation_layers=(1, -1),
        ablation_epochs=2,
        agreement_contexts=3,
        hard_puzzles=6,
        dev_puzzles=4,
        hard_clues=(30, 32),
        generation_contexts=6,
        oracle_puzzles=2,
        likelihood_sequences=3,
        likelihood_draws=8,
        likelihood_repeats=2,
        likelihood_contexts=6,
        nll_draws=4,
        protein_model=ProteinMDMConfig(d_model=32, n_heads=2, n_layers=2),
        protein_train=TrainConfig(steps=20, batch_size=8, lr=1e-3, warmup=5, ckpt_every=10, log_every=5),
        protein_labels=ProteinLabelConfig(n_shards=2, contexts_per_shard=6, window=24, batch_tokens=24 * 256),
        potts_train=TrainConfig(steps=20, batch_size=64, lr=0.01, warmup=5, weight_decay=0.0, ckpt_every=10, log_every=5),
        plm_train=TrainConfig(steps=20, batch_size=64, lr=0.01, warmup=5, weight_decay=0.0, ckpt_every=10, log_every=5),
        potts=PottsMDMConfig(val_every=10, embed_dim=8),
        plm=PottsMDMConfig(masking="one", val_rates=(0.15,), val_every=10, embed_dim=8),
        aligned_labels=AlignedLabelConfig(n_shards=2, contexts_per_shard=10),
        aligned_head_train=HeadTrainConfig(epochs=2, batch_size=4, lr=3e-3, loss_scale=0.001, loss_weight_scale=0.005),
        potts_l2_grid=(0.1,),
        protein_mi_rate_patterns=(1, 2, 8),
        protein_head_train=HeadTrainConfig(epochs=2, batch_size=4),
        protein_head_hidden=32,
        protein_head_rank=16,
        protein_mi_patterns=2,
        protein_mi_delta=0.05,
        protein_infill=3,
        protein_generate=3,
    ),
    "cpu": Profile(
        name="cpu",
        sudoku_model=_RUN_MODEL,  # with the relation attention bias
        sudoku_train=_RUN_TRAIN,  # the committed resumable run (checkpoints/sudoku_cpu_relation24), shipped
        sudoku_curriculum=_RUN_CURRICULUM,
        solve_eval_puzzles=200,
        probe_contexts=8,
        enum_contexts=16,
        enum_clues=(22, 28),
        labels=LabelConfig(n_shards=10, sources_per_shard=20, contexts_per_source=4, layers=(-1, 1, 3)),
        # the bilinear head, chosen for its cost; chapter 2 compares it with the gathered pair network. With the
        # constraint features (issue 20: test Pearson ~0.90 -> ~0.93 at 4 instead of 8 channels, to stay at <= 0.25x
        # a forward)
        head_hidden=128,
        head_rank=16,
        head_arch={"pairs": "bilinear", "channels": 4, "mix_channels": 4, "tri_channels": 4,
                   "constraint_feature": True},
        # a fresh Sudoku symmetry of every training context each epoch (issue 20: test Pearson 0.856 -> ~0.89)
        head_train=HeadTrainConfig(epochs=200, lr=2e-2, augment="sudoku_symmetry"),
        ablation_layers=(1, 3, -1),
        ablation_epochs=20,
        agreement_contexts=12,
        hard_puzzles=1000,
        dev_puzzles=200,
        generation_contexts=100,
        oracle_puzzles=50,
        likelihood_sequences=24,
        likelihood_draws=32,
        likelihood_repeats=6,
        likelihood_contexts=100,
        nll_draws=16,
        protein_labels=ProteinLabelConfig(n_shards=4, contexts_per_shard=16, window=96, delta=0.05, batch_tokens=96 * 256),
        protein_mi_patterns=4,
        protein_mi_delta=0.05,
        protein_infill=48,
        protein_generate=64,
    ),
    "paper": Profile(
        name="paper",
        sudoku_model=SudokuMDMConfig.paper(),
        sudoku_train=TrainConfig(steps=20000, batch_size=256, lr=5e-4, warmup=500, ckpt_every=1000),
        solve_eval_puzzles=1000,
        probe_contexts=64,
        probe_batch_tokens=81 * 4096,
        enum_contexts=48,
        enum_clues=(22, 28),
        max_completions=1_000_000,
        labels=LabelConfig(n_shards=200, sources_per_shard=50, contexts_per_source=4, layers=(-1, 1, 2, 3),
                           batch_tokens="auto"),
        head_hidden=192,  # ~105K parameters on the 4.16M MDM's D=384 (paper: ~100K)
        head_train=HeadTrainConfig(epochs=40, batch_size=64),
        ablation_layers=(1, 2, 3, -1),
        ablation_epochs=15,
        agreement_contexts=48,
        hard_puzzles=1000,
        dev_puzzles=200,
        hard_clues=(22, 25),
        generation_contexts=1000,
        oracle_puzzles=100,
        likelihood_sequences=256,
        likelihood_draws=64,
        likelihood_repeats=16,
        likelihood_contexts=1000,
        nll_draws=64,
        protein_backbone="esmc_300m",
        protein_head_hidden=736,
        protein_head_rank=112,
        protein_model=ProteinMDMConfig(d_model=256, n_heads=8, n_layers=6),
        protein_train=TrainConfig(steps=20000, batch_size=64, lr=1e-3, warmup=500, ckpt_every=1000),
        protein_labels=ProteinLabelConfig(n_shards=40, contexts_per_shard=250, window=160, batch_tokens="auto",
                                          delta=0.0, layers=(-1,)),
        protein_head_train=HeadTrainConfig(epochs=5, batch_size=32),
        protein_mi_patterns=64,
        protein_mi_delta=0.0,
        protein_infill=200,
        protein_generate=200,
    ),
}


def get_profile(name: str) -> Profile:
    """The profile called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}") from None
