"""Decoding: the loop and the unmasking rules (sequential, top-k, threshold, EB-sampler, MI-guided)."""
