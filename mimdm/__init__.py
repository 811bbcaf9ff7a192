"""mimdm: pairwise conditional mutual information in masked diffusion models (MDMs).

Modules: `mimdm.data` (Sudoku), `mimdm.models` (the `MaskedModel` interface, the Sudoku MDM, exact
oracle models, masked-diffusion training), `mimdm.probing` (ground-truth MI by probing),
`mimdm.labels` and `mimdm.heads` (the MI head), `mimdm.metrics`, `mimdm.decoding` (decoding loop and unmasking rules), `mimdm.experiments` (one module per book chapter),
`mimdm.book` (the main job), `mimdm.profiles` (smoke / cpu / paper).
"""

__version__ = "0.1.0"
