"""Core: the `MaskedModel` contract, entropy and exact pairwise MI, artifact files and keys, devices, the process
group, timing, shipped checkpoints and result files. Imports nothing else of the package."""
