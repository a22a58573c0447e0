"""`max_train_seconds`: every rank stops at the same step, and the stop saves a checkpoint `--resume` continues."""

from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import TrainerControl, TrainerState

from mirrorapi.training.time_limit import TimeLimitCallback


def _args(save_strategy: str = "steps", world_size: int = 1) -> SimpleNamespace:
    # The TrainingArguments fields the callback reads (a whole TrainingArguments would set up a device).
    return SimpleNamespace(save_strategy=save_strategy, world_size=world_size, device=torch.device("cpu"))


def test_the_stop_saves_a_checkpoint_unless_saving_is_off():
    for save_strategy, saves in (("steps", True), ("epoch", True), ("no", False)):
        callback, state, control = TimeLimitCallback(0.0), TrainerState(global_step=3, max_steps=10), TrainerControl()
        callback.on_train_begin(_args(save_strategy), state, control)
        control = callback.on_step_end(_args(save_strategy), state, control)
        assert control.should_training_stop and control.should_save is saves


def _rank(rank: int, port: int, limit: float, late_by: float, stops) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        callback, state = TimeLimitCallback(limit), TrainerState(max_steps=100)
        callback.on_train_begin(_args(world_size=2), state, TrainerControl())
        callback._start += late_by if rank == 1 else 0.0  # a rank that began later by its own clock
        for step in range(1, 101):
            time.sleep(0.02)
            state.global_step = step
            control = callback.on_step_end(_args(world_size=2), state, TrainerControl())
            if control.should_training_stop:
                stops[rank] = step
                return
    finally:
        dist.destroy_process_group()


def test_every_rank_stops_at_the_same_step():
    # The skew between the ranks' clocks is made up (a stand-in): real start-up differences are a few ms, which a
    # step of a fast GPU run can fall between, but not on demand.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stops = mp.Manager().dict()
    mp.spawn(_rank, args=(port, 0.3, 0.5, stops), nprocs=2, join=True)
    assert stops[0] == stops[1] and stops[0] < 100
