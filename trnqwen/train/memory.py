"""Memory estimates for preflight: per rank on the device, and per rank in host RAM.

Plain arithmetic from config.json (no torch).  Two budgets, because they fill differently:

* **device** (:func:`estimate_memory`): parameters, gradients and AdamW state sharded over FSDP x
  TP, activations, logits, the all-gathered layers in flight.  HBM on Neuron, GPU memory on CUDA;
  on CPU the device *is* host RAM.
* **host** (:func:`estimate_host_memory`): what each rank process holds in RAM, which the ranks of
  one node share.  Every rank reads the **whole** HF checkpoint at load (torchtitan's HF reader
  hands each rank the full tensors before sharding) and gathers the **whole** model for the HF
  export at the end; on top comes the Python + torch + torchtitan/transformers runtime.  64 ranks
  each holding a full 30B checkpoint is about 3.8 TB: more than a trn2.48xlarge has.

The runtime and load/export terms were measured with real CPU runs (torchtitan 0.3.0,
``tests/test_preflight_host_memory.py`` checks the estimate against a run's peak RSS); the Neuron
runtime's own host footprint is not measured here and comes on top.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.titan_compat import FlavorDims
from trnqwen.units import format_bytes

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

GIB = 1024**3
MIB = 1024**2

# Resident memory of one rank process before the model: Python, torch, torchtitan, transformers,
# the process group.  Measured: peak RSS 1109 MiB of a CPU rank training the 1M-parameter tiny
# model (hf-v5, torchtitan 0.3.0), where the model itself is a few MiB.
RUNTIME_BYTES = 1100 * MIB
# Bytes per parameter the HF export adds at its peak: the gathered full state dict in fp32 plus the
# HF tensors converted from it.  Measured: a 103M-parameter model on one CPU rank peaked at
# 3452 MiB = runtime + 16 B/param of training state + 8 B/param; but seven 2-rank runs of a
# 60M-parameter model peaked 2.07-2.44 GB (the allocator keeps freed export buffers a varying
# while), which needs up to 13 B/param.  13 is the bound that no run measured exceeded.
EXPORT_BYTES_PER_PARAM = 13
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def size(n: int) -> str:
    return format_bytes(n, digits=2 if n >= GIB else 1, smallest="MiB", largest="TiB")


@dataclass
class MemoryEstimate:
    """Device bytes per rank; an upper-ish estimate without activation checkpointing."""

    params: int
    grads: int
    optimizer: int
    activations: int
    logits: int
    gathered: int  # FSDP all-gathered layer parameters in flight (bf16, prefetch of two layers)
    capacity: Optional[int] = None
    num_params: Optional[int] = None
    shards: int = 1

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.logits + self.gathered

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["total"] = self.total
        return out

    def brief(self) -> str:
        """One short line for every run (``describe`` has the breakdown, shown by --dry-run)."""
        cap = f" of {size(self.capacity)}" if self.capacity else ""
        return f"device memory ~{size(self.total)} per rank{cap}"

    def describe(self) -> str:
        parts = (
            f"params {size(self.params)} + grads {size(self.grads)} + AdamW m+v {size(self.optimizer)} + "
            f"activations {size(self.activations)} + logits {size(self.logits)} + all-gathered {size(self.gathered)}"
        )
        cap = f" of {size(self.capacity)}" if self.capacity else ""
        return f"~{size(self.total)} per rank{cap} ({parts})"


@dataclass
class HostMemoryEstimate:
    """Host RAM per rank process at its two peaks, and for all ranks of one node."""

    runtime: int  # Python + torch + trainer imports
    checkpoint: int  # the full HF checkpoint one rank reads (0 when training from random init)
    model: int  # the rank's own parameters while loading, when the device is host RAM (CPU), else 0
    training: int  # the device state when the device is host RAM (CPU), else 0
    export: int  # the gathered full model of the HF export (0 without an export)
    ranks_per_node: int = 1
    capacity: Optional[int] = None  # host RAM of the node

    @property
    def at_load(self) -> int:
        return self.runtime + self.model + self.checkpoint

    @property
    def at_export(self) -> int:
        return self.runtime + self.training + self.export

    @property
    def per_rank(self) -> int:
        return max(self.at_load, self.at_export)

    @property
    def per_node(self) -> int:
        return self.per_rank * self.ranks_per_node

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(at_load=self.at_load, at_export=self.at_export, per_rank=self.per_rank, per_node=self.per_node)
        return out

    def brief(self) -> str:
        """One short line for every run (``describe`` has the breakdown, shown by --dry-run)."""
        cap = f" of {size(self.capacity)}" if self.capacity else ""
        return f"host memory ~{size(self.per_node)}{cap} ({self.ranks_per_node} rank(s) x ~{size(self.per_rank)})"

    def describe(self) -> str:
        cap = f" of {size(self.capacity)} host RAM" if self.capacity else ""
        return (
            f"host ~{size(self.per_rank)} per rank x {self.ranks_per_node} = {size(self.per_node)}{cap} "
            f"(at load {size(self.at_load)}: runtime {size(self.runtime)} + "
            + (f"own parameters {size(self.model)} + " if self.model else "")
            + f"full checkpoint {size(self.checkpoint)}"
            + f"; at export {size(self.at_export)}: "
            + (f"training state {size(self.training)} + " if self.training else "")
            + f"gathered model {size(self.export)})"
        )


def count_params(dims: FlavorDims) -> int:
    """Parameters of a Qwen3 (dense or MoE) from its dims (embeddings, attention, FFN, norms)."""
    h, hd = dims.dim, dims.head_dim
    attn = h * dims.n_heads * hd + 2 * h * dims.n_kv_heads * hd + dims.n_heads * hd * h + 2 * hd
    dense_ffn = 3 * h * (dims.ffn_dim or 4 * h)
    if dims.num_experts:  # a dense/MoE mix: dense_layers have a plain MLP, the others experts + router
        moe_ffn = dims.num_experts * 3 * h * (dims.moe_ffn_dim or 0) + h * dims.num_experts
        n_dense = len(getattr(dims, "dense_layers", ()) or ())
        ffn_total = (dims.n_layers - n_dense) * moe_ffn + n_dense * dense_ffn
    else:
        ffn_total = dims.n_layers * dense_ffn
    embed = dims.vocab_size * h * (1 if dims.tied else 2)
    return dims.n_layers * (attn + 2 * h) + ffn_total + embed + h


def estimate_memory(
    dims: FlavorDims,
    cfg: RunConfig,
    dp: int,
    *,
    capacity: Optional[int] = None,
    num_params: Optional[int] = None,
    trainable: Optional[int] = None,
) -> MemoryEstimate:
    """Per-rank device bytes under FSDP (``dp_shard``) x TP, AdamW, no activation checkpointing.

    ``trainable``: parameters that get gradients and AdamW state (LoRA: the adapters only; a
    frozen base has neither), default all of them.

    * parameters fp32 (4 B), gradients fp32 (4 B), AdamW m + v fp32 (8 B): sharded over
      FSDP x TP ranks;
    * activations: ~34 bytes x seq x batch x hidden per layer in bf16 (the Megatron estimate
      with fused attention), split by TP (sequence parallel);
    * logits + their gradient in fp32 (vocab x seq x batch x 8 B), split by TP;
    * parameters of two layers all-gathered in bf16 at a time (FSDP prefetch).
    """
    n = int(num_params or count_params(dims))
    shards = max(1, dp * cfg.tp)
    params = 4 * n // shards
    tokens = cfg.seq_len * cfg.local_batch_size
    activations = 34 * tokens * dims.dim * dims.n_layers // cfg.tp
    logits = 8 * tokens * dims.vocab_size // cfg.tp
    per_layer = max(0, n - dims.vocab_size * dims.dim * (1 if dims.tied else 2)) // max(1, dims.n_layers)
    gathered = 2 * 2 * per_layer // cfg.tp if shards > 1 else 0
    trained = 4 * (n if trainable is None else int(trainable)) // shards
    return MemoryEstimate(
        params=params + (trained if trainable is not None else 0),  # LoRA: the adapters' own weights
        grads=trained,
        optimizer=2 * trained,
        activations=activations,
        logits=logits,
        gathered=gathered,
        capacity=capacity,
        num_params=n,
        shards=shards,
    )


def checkpoint_bytes(hf_config: dict[str, Any], num_params: int) -> int:
    """Bytes of the published checkpoint: parameters x the dtype config.json names (bf16 if none)."""
    dtype = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16").removeprefix("torch.")
    return num_params * DTYPE_BYTES.get(dtype, 2)


def estimate_host_memory(
    device_estimate: MemoryEstimate,
    cfg: RunConfig,
    hf_config: dict[str, Any],
    *,
    device_type: str,
    ranks_per_node: int,
    exports: bool,
    capacity: Optional[int] = None,
) -> HostMemoryEstimate:
    """Host RAM per rank: runtime + the full checkpoint at load, or the gathered model at export.

    ``device_estimate.num_params`` is the model trained; on CPU its device state is host memory too.
    """
    n = int(device_estimate.num_params or 0)
    loads = bool(cfg.finetune)
    return HostMemoryEstimate(
        runtime=RUNTIME_BYTES,
        checkpoint=checkpoint_bytes(hf_config, n) if loads else 0,
        model=device_estimate.params if device_type == "cpu" else 0,
        training=device_estimate.total if device_type == "cpu" else 0,
        export=EXPORT_BYTES_PER_PARAM * n if exports else 0,
        ranks_per_node=max(1, int(ranks_per_node)),
        capacity=capacity,
    )
