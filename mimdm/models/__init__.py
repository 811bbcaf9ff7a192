"""Models of the study, all behind the `MaskedModel` interface (`mimdm.core.contract`)."""
