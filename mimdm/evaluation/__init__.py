"""Evaluation: metrics (P@L, AUROC, graph recovery), I-MDCE likelihood estimators, protein quality, and the
content-keyed cache of decodes and NLL scores."""
