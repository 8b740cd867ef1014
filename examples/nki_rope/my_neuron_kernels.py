"""The recipe's custom kernel: nkilib's ``rope_hf`` as Qwen3's rotary embedding on Trainium.

Written for torchtitan 0.3.0's override registry and torch-neuronx's NKI operator API:

1. ``rope_hf`` (``nkilib.core.embeddings.rope_hf``) is made callable from PyTorch with
   ``wrap_nki`` and launched on ``LNC`` logical-core shards (``[(lnc,)]``);
2. ``nki_op("my_kernels::rope_fwd")`` / ``nki_op("my_kernels::rope_bwd")`` register it as two
   PyTorch operators (eager and ``torch.compile``), and ``register_autograd`` makes the
   backward kernel (``rope_hf(..., backward=True)``) the forward's gradient;
3. torchtitan stores q/k as ``[batch, seq, heads, head_dim]`` and ``rope_hf`` wants
   ``[batch, heads, seq, head_dim]``: ``NKIRoPE`` transposes in and out, and passes the rotary
   cache as ``[seq, head_dim * 2]`` (cosines first, sines second);
4. ``rope_hf`` needs the sequence length to be a multiple of ``128 * LNC`` (256 at LNC=2):
   :func:`check_seq_len` refuses anything else before the kernel is ever launched;
5. ``NKIRoPE(CosSinRoPE)`` with its own ``Config`` is attached by ``@override(target=
   CosSinRoPE.Config, exact=True, ...)``; the factory returns ``derive(cfg, NKIRoPE.Config)``.

Run it on a trn2.48xlarge from this folder (torchtitan 0.3.0 names an override by its
factory's ``module.function`` path)::

    cd examples/nki_rope
    trnqwen train --backend native --finetune --seq-len 2048 \\
        --override-imports my_neuron_kernels.nki_rope

torchtitan then logs one ``[Override] my_neuron_kernels.nki_rope: model_spec.model.layers.N.
attention.rope CosSinRoPE.Config -> NKIRoPE.Config`` line per Qwen3 layer (36 for Qwen3-4B);
``trnqwen inspect-logs`` checks there is exactly one per layer.  To check the training length
when the override is applied (before any step), pass it along:
``--override-imports 'my_neuron_kernels.nki_rope={"seq_len": 2048}'``.

To replace only layers 10-19, use ``nki_rope_layers_10_19`` instead (``fqns`` selects nodes by
glob; two overrides claiming one node stop torchtitan, and one matching nothing is a warning).

Needs: torch-neuronx (2.13+, native ``neuron`` device), nkilib, torchtitan 0.3.0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch_neuronx import nki_op, wrap_nki
from torchtitan.config import derive, override
from torchtitan.models.common.rope import CosSinRoPE

from nkilib.core.embeddings.rope_hf import rope_hf

__all__ = [
    "NKI_TILE",
    "NKIRoPE",
    "check_seq_len",
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


def check_seq_len(seq_len: int, lnc: int | None = None) -> None:
    """Refuse a sequence length ``rope_hf`` cannot tile: it must be a multiple of 128 x LNC."""
    lnc = logical_cores() if lnc is None else int(lnc)
    tile = NKI_TILE * lnc
    if seq_len <= 0 or seq_len % tile:
        lower = max(tile, seq_len // tile * tile)
        raise ValueError(
            f"NKI rope_hf needs the sequence length to be a multiple of {tile} (128 x LNC={lnc}), "
            f"got {seq_len}; use --seq-len {lower} or {lower + tile}"
        )


# --- the operators -------------------------------------------------------------------------------


@nki_op("my_kernels::rope_fwd", mutates_args={})
def rope_fwd(q: torch.Tensor, k: torch.Tensor, rope_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE forward on ``[batch, heads, seq, head_dim]`` q/k with a ``[seq, head_dim*2]`` cache."""
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
        pass

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions is not None:  # per-token positions: rope_hf takes a contiguous prefix cache
            return super().forward(query, key, positions)
        batch, seq_len, _heads, head_dim = query.shape
        check_seq_len(seq_len)
        rope_cache = self.cache[:seq_len].reshape(seq_len, head_dim * 2).contiguous()
        q = query.transpose(1, 2).contiguous()  # [b, s, h, d] -> [b, h, s, d]
        k = key.transpose(1, 2).contiguous()
        q_out, k_out = rope_fwd(q, k, rope_cache)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)  # back to [b, s, h, d]


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
    return derive(cfg, NKIRoPE.Config)


@override(
    target=CosSinRoPE.Config,
    exact=True,
    description="NKI rope_hf kernel on layers 10-19 only",
    fqns=["*layers.1[0-9].attention.rope"],
)
def nki_rope_layers_10_19(cfg: CosSinRoPE.Config) -> NKIRoPE.Config:
    return derive(cfg, NKIRoPE.Config)
