"""Training: the recipe behind `training/sft.py` (arguments, checks, inputs: `recipe`), the run and its
bookkeeping (`sft`), the throughput callback (`throughput`), the model card, LoRA merging (`merge`) and
the tiny model used by tests and the demo.
"""
