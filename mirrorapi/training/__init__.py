"""Training: the recipe behind `training/sft.py` (arguments, checks, data loading), the throughput
callback, the model card, LoRA merging and the tiny model used by tests and the demo.
"""
