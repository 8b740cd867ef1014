"""A run's topology from its config and device (the rules: :mod:`trnqwen.contract.topology`).

Ranks per node come from ``--nproc-per-node`` or the device; :func:`plan_topology` is called once
per run and its :class:`~trnqwen.contract.topology.Topology` is carried by the plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from trnqwen.contract.topology import Topology, topology

if TYPE_CHECKING:
    from trnqwen.config import RunConfig
    from trnqwen.env.device import DeviceInfo


def ranks_per_node(nproc_per_node: Optional[int], device: DeviceInfo) -> int:
    """``--nproc-per-node`` when given, else every device of the node (1 on CPU).

    Logical NeuronCores on Neuron (64 on a trn2.48xlarge at LNC 2), GPUs on CUDA.
    """
    if nproc_per_node:
        return int(nproc_per_node)
    if device.type == "cpu":
        return 1
    return max(1, int(device.count or 1))


def plan_topology(cfg: RunConfig, device: DeviceInfo) -> Topology:
    """The topology of ``cfg`` on ``device`` (every node of the job counted)."""
    return topology(
        nnodes=cfg.nnodes,
        nproc_per_node=ranks_per_node(cfg.nproc_per_node, device),
        tp=cfg.tp,
        dp_shard=cfg.dp_shard,
        local_batch_size=cfg.local_batch_size,
        global_batch_size=cfg.global_batch_size,
    )
