"""The stages of `scripts/train_shipped_models.py` (the shipped simulator and judge). Not part of the wheel."""
