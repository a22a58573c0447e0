"""Bootstrap intervals of the reports' figures: the scored rows resampled with replacement, BOOTSTRAP_RESAMPLES
times with a fixed seed, so that a rerun on the same rows gives the same interval (percentile intervals, Efron &
Tibshirani 1993). A figure over a few dozen rows (a source's held-out calls, a source's labelled answers) moves by
points from one draw of its rows to the next; the interval says by how much."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 12345
Row = TypeVar("Row")


def resamples(n: int) -> np.ndarray:
    """(BOOTSTRAP_RESAMPLES, n) row indices, drawn with replacement; the same for every call with the same n."""
    import numpy as np  # here, as elsewhere in the library: a command that reports nothing does not load it

    return np.random.default_rng(BOOTSTRAP_SEED).choice(n, size=(BOOTSTRAP_RESAMPLES, n))


def resample_weights(n: int, groups: Sequence[Hashable] | None = None) -> np.ndarray:
    """`resamples(n)` as a (BOOTSTRAP_RESAMPLES, n) matrix of how often each row is drawn: a sum over each resample
    is then one matrix product (`weights @ values`), without the (resamples, n, columns) array indexing makes.

    `groups` (each row's group, e.g. a call's episode): whole groups are drawn instead, as many as there are, and
    each row weighs as often as its group was drawn (a cluster bootstrap). The calls of one episode share its state
    and the agent's choices, so they are no independent draws: resampled one by one they give intervals too narrow
    wherever an episode holds several calls. One row per group draws exactly what `resamples(n)` draws."""
    import numpy as np

    if groups is not None:
        number = {group: i for i, group in enumerate(dict.fromkeys(groups))}
        return resample_weights(len(number))[:, [number[group] for group in groups]]
    weights = np.zeros((BOOTSTRAP_RESAMPLES, n))
    np.add.at(weights, (np.arange(BOOTSTRAP_RESAMPLES)[:, None], resamples(n)), 1.0)
    return weights


def percentile_interval(values: Sequence[float] | np.ndarray, digits: int | None = 2) -> list[float] | None:
    """The 95% percentile interval of a figure's resampled values, rounded to `digits` (None: not rounded, for
    figures a report rounds once as it prints them); None when there are none (undefined on every resample)."""
    import numpy as np

    if len(values) == 0:
        return None
    bounds = [float(v) for v in np.percentile(values, [2.5, 97.5])]
    return bounds if digits is None else [round(v, digits) for v in bounds]


def interval_of(
    rows: Sequence[Row],
    figure: Callable[[list[Row]], float | None],
    digits: int = 2,
    groups: Sequence[Hashable] | None = None,
) -> list[float] | None:
    """The 95% interval of `figure` (a function of a list of rows) over the resamples of `rows`; resamples where
    the figure is undefined (None: e.g. kappa where every row has one label) are left out. `groups` (each row's):
    whole groups are drawn instead, as `resample_weights` draws them; None (no interval) for rows of one group."""
    if not rows:
        return None
    if groups is None:
        draws = ([rows[i] for i in draw] for draw in resamples(len(rows)))
    else:
        members: dict = {}
        for row, group in zip(rows, groups, strict=True):
            members.setdefault(group, []).append(row)
        if len(members) < 2:
            return None
        clusters = list(members.values())
        draws = ([row for i in draw for row in clusters[i]] for draw in resamples(len(clusters)))
    values = [figure(draw) for draw in draws]
    return percentile_interval([v for v in values if v is not None], digits)
