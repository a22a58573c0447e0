"""A wall-clock limit on training, through transformers' public callback API.

`max_train_seconds` (a recipe key) ends training at the first step that finishes past the limit; the run then
saves a checkpoint (which `--resume` continues from) and evaluates as a finished run does. For a run that must
fit a lent machine's time (a GPU lent for minutes): the step count a run reaches there is not known before it
starts, and an hour-long timeout that kills the process would lose the weights. Under several processes every
rank stops at the same step: each rank's clock is its own, and a rank that left the loop alone would leave the
others waiting in a collective forever (Accelerate's "early stopping leads to hanging").
"""

from __future__ import annotations

import logging
import time

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class TimeLimitCallback(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds, self._start = seconds, time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        over = time.perf_counter() - self._start >= self.seconds
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([float(over)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)  # one rank past it: all stop
            over = bool(flag.item())
        if over and not control.should_training_stop:
            logger.info(
                "max_train_seconds %s reached at step %d of %d: stopping",
                self.seconds,
                state.global_step,
                state.max_steps,
            )
            control.should_training_stop = True
            control.should_save = args.save_strategy != "no"  # a checkpoint, as at max_steps
        return control
