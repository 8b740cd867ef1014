"""The recipe's custom kernel: nkilib's ``rope_hf`` as Qwen3's rotary embedding on Trainium.

Written for torchtitan 0.3.0's override registry and torch-neuronx's NKI operator API:

1. ``rope_hf`` (``nkilib.core.embeddings.rope_hf``) is made callable from PyTorch with
   ``wrap_nki`` and launched on ``LNC`` logical-core shards (``[(lnc,)]``);
2. ``nki_op("my_kernels::rope_fwd")`` / ``nki_op("my_kernels::rope_bwd")`` register it as two
   PyTorch operators (eager and ``torch.compile``), and ``register_autograd`` makes the
   backward kernel (``rope_hf(..., backward=True)``) the forward's gradient;
3. torchtitan stores q/k as ``[batch, seq, heads, head_dim]`` and ``rope_hf`` wants
   ``[batch, heads, seq, head_dim]``: ``NKIRoPE`` transposes in and out.  The rotary cache rows
   are ``[cos | sin]`` (``head_dim * 2`` wide, torchtitan's ``CosSinRoPE`` cache).  torchtitan
   0.3.0's dataloader yields per-document ``positions`` (they restart at 0 at every document
   packed into a window), so ``NKIRoPE`` gathers one cache row per token and hands ``rope_hf``
   the batched cache it accepts, ``[batch, seq, head_dim * 2]`` (``[seq, head_dim * 2]`` when all
   rows share their positions or none are given);
4. ``rope_hf`` needs the sequence length to be a multiple of ``128 * LNC`` (256 at LNC=2): a
   call with any other length runs torchtitan's own rotation instead, counted as a fallback and
   warned about once; :func:`check_seq_len` refuses such a length when the override is applied
   if you pass it ``seq_len``;
5. ``NKIRoPE(CosSinRoPE)`` with its own ``Config`` is attached by ``@override(target=
   CosSinRoPE.Config, exact=True, ...)``; the factory returns ``derive(cfg, NKIRoPE.Config)``.

Run it on a trn2.48xlarge from this folder (torchtitan 0.3.0 names an override by its
factory's ``module.function`` path)::

    cd examples/nki_rope
    trnqwen train --backend native --finetune --seq-len 2048 \\
        --override-imports my_neuron_kernels.nki_rope

torchtitan then logs one ``[Override] my_neuron_kernels.nki_rope: model_spec.model.layers.N.
attention.rope CosSinRoPE.Config -> NKIRoPE.Config`` line per Qwen3 layer (36 for Qwen3-4B).
That proves the module was installed, not that the kernel ran: after the first optimizer step
each rank logs ``[OverrideCalls] my_neuron_kernels.nki_rope: calls=72 fallbacks=0 modules=36
rank=R step=1`` (calls that launched ``rope_fwd``, calls that fell back, layers that ran it).
``trnqwen inspect-logs`` checks both: one ``[Override]`` line per layer, kernel calls, no fallbacks.  To check the training length
when the override is applied (before any step), pass it along:
``--override-imports 'my_neuron_kernels.nki_rope={"seq_len": 2048}'``.

To replace only layers 10-19, use ``nki_rope_layers_10_19`` instead (``fqns`` selects nodes by
glob; two overrides claiming one node stop torchtitan, and one matching nothing is a warning).

Needs: torch-neuronx (2.13+, native ``neuron`` device), nkilib, torchtitan 0.3.0.  The file
imports one thing from trnqwen, its call counter (``trnqwen.runtime.override_calls.module_counter``,
installed wherever trnqwen trains): copy it and change the kernel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch.distributed.tensor import DTensor
from torch_neuronx import nki_op, wrap_nki
from torchtitan.config import derive, override
from torchtitan.models.common.rope import CosSinRoPE

from trnqwen.contract.override_calls import CALLS_TAG
from trnqwen.runtime.override_calls import ModuleCallCounter, module_counter as counter_for

from nkilib.core.embeddings.rope_hf import rope_hf

__all__ = [
    "CALLS_TAG",
    "ModuleCallCounter",
    "NKI_TILE",
    "NKIRoPE",
    "check_seq_len",
    "gather_rope_cache",
    "seq_len_problem",
    "logical_cores",
    "nki_rope",
    "nki_rope_layers_10_19",
    "rope_bwd",
    "rope_fwd",
]

NKI_TILE = 128  # rope_hf processes the sequence in 128-row tiles on each logical-core shard
ALL_LAYERS = ["*layers.*.attention.rope"]


def logical_cores() -> int:
    """The LNC setting (1 or 2) the kernel is launched with."""
    try:
        from torch_neuronx.utils import get_logical_neuron_cores

        return int(get_logical_neuron_cores())
    except (ImportError, AttributeError, ValueError, TypeError):
        return int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))


def seq_len_problem(seq_len: int, lnc: int | None = None) -> Optional[str]:
    """Why ``rope_hf`` cannot tile this sequence length (a multiple of 128 x LNC), or None."""
    lnc = logical_cores() if lnc is None else int(lnc)
    tile = NKI_TILE * lnc
    if seq_len > 0 and seq_len % tile == 0:
        return None
    lower = max(tile, seq_len // tile * tile)
    return (f"NKI rope_hf needs the sequence length to be a multiple of {tile} (128 x LNC={lnc}), "
            f"got {seq_len}; use --seq-len {lower} or {lower + tile}")


def check_seq_len(seq_len: int, lnc: int | None = None) -> None:
    """Refuse a sequence length ``rope_hf`` cannot tile (ValueError naming two lengths it can)."""
    problem = seq_len_problem(seq_len, lnc)
    if problem:
        raise ValueError(problem)


# --- proof that the custom path ran -------------------------------------------------------------
#
# Each module keeps two 0-d int64 buffers, custom_calls and fallback_calls, and adds 1 to one of
# them per call (a tensor op: the count stays right under torch.compile).  trnqwen's counter sums
# them over the modules and logs the [OverrideCalls] line after the first optimizer step that
# followed a call (a resumed run's checkpoint load takes one step before any forward):
#
#     [OverrideCalls] NAME: calls=C fallbacks=F modules=M rank=R step=1[ reason: TEXT]
#
# counter_for(name) is one counter per override name, shared by every module it replaced.


def gather_rope_cache(
    cache: torch.Tensor, positions: Optional[torch.Tensor], batch: int, seq_len: int
) -> tuple[Optional[torch.Tensor], str]:
    """The kernel's cache for these positions, or ``(None, why)`` when it cannot be built.

    No positions: the cache's first ``seq_len`` rows (``[seq, 2d]``).  Positions ``[1, seq]`` or
    ``[batch, seq]`` (per-document positions restart at 0 mid-window): one cache row per token,
    ``[seq, 2d]`` for a single row, ``[batch, seq, 2d]`` otherwise.
    """
    if positions is None:
        if cache.shape[0] < seq_len:
            return None, f"the rope cache has {cache.shape[0]} rows, the sequence {seq_len}"
        return cache[:seq_len], ""
    if isinstance(positions, DTensor):
        positions = positions.to_local()
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)
    if positions.dim() != 2 or positions.shape[-1] != seq_len or positions.shape[0] not in (1, batch):
        return None, f"positions of shape {tuple(positions.shape)} do not match q's local [batch={batch}, seq={seq_len}]"
    if not torch.compiler.is_compiling():  # the same asynchronous bounds check as torchtitan's
        torch._assert_async(torch.all(positions < cache.shape[0]), "positions exceed the rope cache")
    if positions.shape[0] == 1:
        return cache[positions[0]], ""
    return cache[positions], ""  # [batch, seq, 2d], contiguous (advanced indexing copies)


# --- the operators -------------------------------------------------------------------------------


@nki_op("my_kernels::rope_fwd", mutates_args={})
def rope_fwd(q: torch.Tensor, k: torch.Tensor, rope_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE forward on ``[batch, heads, seq, head_dim]`` q/k with a ``[(batch,) seq, head_dim*2]`` cache."""
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    q_out, k_out = wrap_nki(rope_hf)[(logical_cores(),)](q, k, q_out, k_out, rope_cache=rope_cache, backward=False)
    return q_out, k_out


@nki_op("my_kernels::rope_bwd", mutates_args={})
def rope_bwd(
    grad_q: torch.Tensor, grad_k: torch.Tensor, rope_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of :func:`rope_fwd` with respect to q and k (the inverse rotation)."""
    dq = torch.empty_like(grad_q)
    dk = torch.empty_like(grad_k)
    dq, dk = wrap_nki(rope_hf)[(logical_cores(),)](grad_q, grad_k, dq, dk, rope_cache=rope_cache, backward=True)
    return dq, dk


def _setup_context(ctx, inputs, output) -> None:
    q, k, rope_cache = inputs
    ctx.save_for_backward(rope_cache)
    ctx.q_shape, ctx.k_shape = q.shape, k.shape


def _backward(ctx, grad_q_out, grad_k_out):
    (rope_cache,) = ctx.saved_tensors
    if grad_q_out is None:
        grad_q_out = rope_cache.new_zeros(ctx.q_shape)
    if grad_k_out is None:
        grad_k_out = rope_cache.new_zeros(ctx.k_shape)
    dq, dk = rope_bwd(grad_q_out.contiguous(), grad_k_out.contiguous(), rope_cache)
    return dq, dk, None


rope_fwd.register_autograd(_backward, setup_context=_setup_context)


# --- the torchtitan module and its override --------------------------------------------------------


class NKIRoPE(CosSinRoPE):
    """``CosSinRoPE`` whose rotation is the NKI kernel (same cache, same numbers)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        override_name: str = f"{__name__}.nki_rope"  # whose [OverrideCalls] line counts this module

    def __init__(self, config: Config):
        super().__init__(config)
        self.register_buffer("custom_calls", torch.zeros((), dtype=torch.int64), persistent=False)
        self.register_buffer("fallback_calls", torch.zeros((), dtype=torch.int64), persistent=False)
        self.counter = counter_for(config.override_name)
        self.counter.track(self)

    def _init_self_buffers(self, *, buffer_device: torch.device | None = None) -> None:
        super()._init_self_buffers(buffer_device=buffer_device)
        device = self.cache.device if buffer_device is None else buffer_device
        self.custom_calls = torch.zeros((), dtype=torch.int64, device=device)  # to_empty() left garbage
        self.fallback_calls = torch.zeros((), dtype=torch.int64, device=device)

    def _fall_back(self, why: str, query, key, positions):
        self.fallback_calls.add_(1)
        self.counter.fell_back(why)
        return super().forward(query, key, positions)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sharded = isinstance(query, DTensor)
        q = query.to_local() if sharded else query
        k = key.to_local() if sharded else key
        batch, seq_len, _heads, _head_dim = q.shape
        problem = seq_len_problem(seq_len)
        if problem:  # rope_hf cannot tile this length: torchtitan's rotation, counted
            return self._fall_back(problem, query, key, positions)
        cache = self.cache.to_local() if isinstance(self.cache, DTensor) else self.cache
        rope_cache, why = gather_rope_cache(cache, positions, batch, seq_len)
        if rope_cache is None:
            return self._fall_back(why, query, key, positions)
        self.custom_calls.add_(1)
        q_out, k_out = rope_fwd(
            q.transpose(1, 2).contiguous(),  # [b, s, h, d] -> [b, h, s, d]
            k.transpose(1, 2).contiguous(),
            rope_cache.contiguous(),
        )
        q_out, k_out = q_out.transpose(1, 2), k_out.transpose(1, 2)  # back to [b, s, h, d]
        if sharded:
            q_out = DTensor.from_local(q_out, query.device_mesh, query.placements, run_check=False)
            k_out = DTensor.from_local(k_out, key.device_mesh, key.placements, run_check=False)
        return q_out, k_out


@override(
    target=CosSinRoPE.Config,
    exact=True,
    description="NKI rope_hf kernel (my_kernels::rope_fwd/rope_bwd)",
    fqns=ALL_LAYERS,
)
def nki_rope(cfg: CosSinRoPE.Config, seq_len: int | None = None) -> NKIRoPE.Config:
    """Every Qwen3 layer's RoPE -> :class:`NKIRoPE`; ``seq_len`` (optional) is checked now."""
    if seq_len is not None:
        check_seq_len(int(seq_len))
    return derive(cfg, NKIRoPE.Config, override_name=f"{__name__}.nki_rope")


@override(
    target=CosSinRoPE.Config,
    exact=True,
    description="NKI rope_hf kernel on layers 10-19 only",
    fqns=["*layers.1[0-9].attention.rope"],
)
def nki_rope_layers_10_19(cfg: CosSinRoPE.Config) -> NKIRoPE.Config:
    return derive(cfg, NKIRoPE.Config, override_name=f"{__name__}.nki_rope_layers_10_19")
