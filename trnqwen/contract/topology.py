"""How many ranks a run has and how they split: the one home of the topology rules.

The world size, the tensor- and data-parallel degrees and the global-batch rule are worked out
by :func:`topology`, once per run by the launcher (:func:`trnqwen.train.topology.plan_topology`,
from the config and the device) and again by the hf-trainer ranks from their spec; the recipes,
preflight, multi-node and the hf-trainer spec read the result and never recompute it.  The rules
are torchtitan's: ``dp_shard x tp == world size`` (``dp_shard -1`` = world / tp) and
``global batch % (local batch x dp) == 0``, the quotient being the gradient-accumulation count.

A topology that breaks a rule still has every field; its :attr:`Topology.problems` say what is
wrong in one wording, and preflight is the place that reports them.  Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

PARALLELISM = "parallelism"  # preflight check names of the problems
BATCH = "batch"


@dataclass(frozen=True)
class Problem:
    check: str  # PARALLELISM | BATCH
    message: str
    hint: str


@dataclass(frozen=True)
class Topology:
    """The ranks of one run and how they split (``dp`` = ranks that see different data)."""

    nnodes: int
    nproc_per_node: int
    tp: int
    dp: int  # the FSDP degree, -1 resolved (no replicate / CP / PP dimension)
    local_batch_size: int
    global_batch_size: Optional[int]  # as configured; None = local batch x dp
    grad_accum_steps: int
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sequences_per_step(self) -> int:
        """Sequences per optimizer step over all ranks (local batch x dp x accumulation)."""
        return self.local_batch_size * self.dp * self.grad_accum_steps

    def problem(self, check: str) -> Optional[Problem]:
        return next((p for p in self.problems if p.check == check), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "nnodes": self.nnodes,
            "nproc_per_node": self.nproc_per_node,
            "world_size": self.world_size,
            "tp": self.tp,
            "dp": self.dp,
            "global_batch_size": self.sequences_per_step,
            "grad_accum_steps": self.grad_accum_steps,
        }


def topology(
    *,
    nnodes: int = 1,
    nproc_per_node: int,
    tp: int = 1,
    dp_shard: int = -1,
    local_batch_size: int = 1,
    global_batch_size: Optional[int] = None,
) -> Topology:
    """Degrees and batch over ``nnodes x nproc_per_node`` ranks, with torchtitan's rules checked.

    A TP group spanning two nodes is allowed but warned about: its collectives would cross the
    network on every layer.
    """
    world = nnodes * nproc_per_node
    problems: list[Problem] = []
    dp = world // tp if dp_shard == -1 else dp_shard
    if world % tp:
        problems.append(Problem(
            PARALLELISM,
            f"--tp {tp} does not divide the {world} ranks",
            f"pick --tp from the divisors of {world} (a divisor of {nproc_per_node} keeps TP inside a node)",
        ))
    elif dp * tp != world:
        problems.append(Problem(
            PARALLELISM,
            f"--dp-shard {dp_shard} x --tp {tp} = {dp_shard * tp} ranks, but the run has {world}",
            "use --dp-shard -1 (shard over all ranks) or matching degrees",
        ))
    grad_accum = 1
    if not problems and global_batch_size is not None:
        per_step = local_batch_size * dp
        if global_batch_size % per_step:
            problems.append(Problem(
                BATCH,
                f"global batch {global_batch_size} is not a multiple of local batch {local_batch_size} "
                f"x data-parallel degree {dp} = {per_step}",
                f"use --global-batch-size {per_step} (or a multiple of it for gradient accumulation)",
            ))
        else:
            grad_accum = global_batch_size // per_step
    warnings = []
    if nnodes > 1 and nproc_per_node % tp:
        warnings.append(
            f"--tp {tp} does not divide the {nproc_per_node} ranks per node: tensor-parallel groups span "
            "nodes and every layer's collectives cross the network"
        )
    return Topology(
        nnodes=nnodes, nproc_per_node=nproc_per_node, tp=tp, dp=dp, local_batch_size=local_batch_size,
        global_batch_size=global_batch_size, grad_accum_steps=grad_accum, problems=tuple(problems),
        warnings=tuple(warnings),
    )
