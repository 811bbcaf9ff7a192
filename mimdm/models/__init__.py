"""Models of the study, all behind the `MaskedModel` interface (`mimdm.models.base`)."""
