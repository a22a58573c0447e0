"""StableToolBench answer files: raw answers converted (`convert`), converted answers read into the items a
judge scores (`items`)."""
