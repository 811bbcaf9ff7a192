"""mimdm: pairwise conditional mutual information in masked diffusion models (MDMs).

Layers, lowest first (each imports only its own and lower layers; DESIGN.md, checked by `lint-imports`):
`mimdm.core` (the `MaskedModel` contract, information quantities, artifacts, devices, timing) <
`mimdm.data` < `mimdm.models` < `mimdm.probing` (ground-truth MI) < `mimdm.heads` (the MI head) <
`mimdm.sampling` (decoding rules) < `mimdm.evaluation` < `mimdm.pipelines` (train-or-load, MI labels) <
`mimdm.experiments` (one module per book chapter) < `mimdm.app` (CLI, main job, profiles).
"""

__version__ = "0.1.0"
