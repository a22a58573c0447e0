"""`logits_only_where_loss`: TRL's fused LM head, told to project only the positions that carry a loss.

TRL's SFTTrainer (1.x) never builds the `(batch, seq_len, vocab)` logits: `trl.trainer.utils.add_fused_lm_head`
projects the hidden states through the LM head in tiles and returns per-token log-probabilities. On a Triton
device (CUDA, XPU) it projects only the positions whose next-token label is not -100 ("compact"); elsewhere it
projects every position, because on Neuron a varying number of positions would recompile the graph on every
batch. A CPU compiles nothing, yet it gets the every-position path: for a simulator record, where ~90% of the
tokens are prompt (no loss), most of the 49k-vocabulary projection and its backward is thrown away.

TRL decides this in one place, the module-level `_use_triton(device)` that its fused forward looks up on every
call; the kernels themselves read their own binding (trl.kernels.chunked_logprob) and keep their CPU tiles. So
rather than a second, hand-written LM head and loss (and TRL's entropy and token-accuracy metrics to redo), the
option answers "compact" for the duration of the training run: the same TRL code, on fewer rows.
tests/training/test_lm_head.py checks that the loss and the gradients equal the every-position path's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def compact_lm_head_supported() -> bool:
    """Whether the installed TRL has the fused LM head this option steers (TRL 1.x's `add_fused_lm_head`)."""
    try:
        import trl.trainer.utils as trl_utils
    except ImportError:
        return False
    return hasattr(trl_utils, "add_fused_lm_head") and callable(getattr(trl_utils, "_use_triton", None))


@contextlib.contextmanager
def logits_only_where_loss(enabled: bool = True) -> Iterator[None]:
    """Within the block, SFTTrainer's fused LM head projects only the positions whose label carries a loss, on any
    device (the kernels still pick Triton or torch tiles by the device). Restored on exit, so other trainers in the
    process (the test suite's) keep TRL's own choice."""
    if not enabled:
        yield
        return
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original
