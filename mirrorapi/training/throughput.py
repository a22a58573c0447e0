"""Training throughput in every training log line, through transformers' public callback API.

`tokens_per_second`: input tokens the model ran on since the previous log line (the Trainer's own
`num_input_tokens_seen`, summed over all processes; "non_padding" unless the recipe asks otherwise,
so padded and packed batches are compared on the tokens they carry), over the wall time between the
two lines. On a CUDA host also `peak_memory_gib`: this process's peak of allocated GPU memory.
"""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback


class ThroughputCallback(TrainerCallback):
    def __init__(self) -> None:
        self._tokens: int = 0
        self._time: float | None = None  # of the previous log line

    def on_train_begin(self, args, state, control, **kwargs):
        self._tokens, self._time = state.num_input_tokens_seen, time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._time is None:
            return
        now, tokens = time.perf_counter(), state.num_input_tokens_seen
        added = {}
        if now > self._time and tokens > self._tokens:
            added["tokens_per_second"] = round((tokens - self._tokens) / (now - self._time), 1)
        if torch.cuda.is_available() and not args.use_cpu:
            added["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        self._tokens, self._time = tokens, now
        logs.update(added)  # printed by the progress callback, which runs after this one
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(added)  # the Trainer appended its copy before calling us
