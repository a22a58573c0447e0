"""A wall-clock limit on training, through transformers' public callback API.

`max_train_seconds` (a recipe key) ends training at the first step that finishes past the limit; the run then
saves and evaluates as a finished run does. For a run that must fit a lent machine's time (a GPU lent for
minutes): the step count a run reaches there is not known before it starts, and an hour-long timeout that kills
the process would lose the weights.
"""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class TimeLimitCallback(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds, self._start = seconds, time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self._start >= self.seconds and not control.should_training_stop:
            logger.info(
                "max_train_seconds %s reached at step %d of %d: stopping",
                self.seconds,
                state.global_step,
                state.max_steps,
            )
            control.should_training_stop = True
        return control
