"""Which machines, and how many of them, a job's GPUs may run on (pure numpy).

A plan runs ``nodes`` identical machines of one offer (one zone): a single machine, or a
gang. ``resources.gpus`` is GPUs per machine when ``resources.nodes`` is given; without it,
the job's GPUs in all, and the planner decides:

- some machine that passes the job's other filters holds at least ``gpus`` GPUs: machines
  with exactly ``gpus`` GPUs, one each (as before gangs existed; a program written for one
  machine is never handed several unasked);
- ``gpus`` is more than any such machine holds: every split into ``N`` identical machines of
  ``g`` GPUs, ``N x g = gpus``, ``2 <= N <= MAX_NODES`` (32 -> 4 x 8, 2 x 16, 8 x 4, ...),
  ranked together by the planner's rules.
"""

from __future__ import annotations

import numpy as np

from broker.core.node_scaling import MAX_NODES

MAX_TOTAL_GPUS = 128  # the most GPUs a job may ask for in all (16 nodes x 8 GPUs)


def node_counts(
    gpus: int, nodes: int | None, gpu_count: np.ndarray, eligible: np.ndarray
) -> np.ndarray:
    """Machines per plan on each offer row by its GPU count alone (0: the count does not
    fit), for a job asking ``gpus`` GPUs (per machine when ``nodes`` is given).
    ``eligible``, the rows passing the job's other filters, decides between one machine and
    a gang; callers mask the result with it."""
    count = np.asarray(gpu_count)
    if nodes is not None:
        return np.where(count == gpus, nodes, 0)
    if not is_gang_request(gpus, nodes, count, eligible):
        return np.where(count == gpus, 1, 0)
    split, left = np.divmod(gpus, np.maximum(count, 1))
    fits = (count > 0) & (left == 0) & (split >= 2) & (split <= MAX_NODES)
    return np.where(fits, split, 0)


def is_gang_request(
    gpus: int, nodes: int | None, gpu_count: np.ndarray, eligible: np.ndarray
) -> bool:
    """Whether the job's plans are gangs: ``nodes`` > 1, or none given and ``gpus`` more
    than any eligible machine holds."""
    if nodes is not None:
        return nodes > 1
    return bool(eligible.any()) and gpus > int(np.asarray(gpu_count)[eligible].max())
