"""A pure-PyTorch rotary embedding attached through torchtitan's override registry.

The same contract as the NKI example in ``examples/nki_rope/my_neuron_kernels.py``, with the
kernel written in plain PyTorch so it runs anywhere (CPU included):

* torchtitan hands RoPE ``q``/``k`` as ``[batch, seq, heads, head_dim]``; the kernel works in the
  Hugging Face layout ``[batch, heads, seq, head_dim]`` (what nkilib's ``rope_hf`` wants), so the
  module transposes in and out;
* the rotary cache is ``[seq, head_dim * 2]``: cosines in the first half, sines in the second
  (torchtitan's ``CosSinRoPE`` cache, sliced to the sequence length);
* ``TorchRoPE`` subclasses ``CosSinRoPE`` with its own ``Config``; the factory returns
  ``derive(cfg, TorchRoPE.Config)`` so every field of the original config is kept.

Use it (torchtitan 0.3.0 names an override by its factory's ``module.function`` path)::

    cd examples/torch_rope
    trnqwen train --backend native --model builtin:tiny-qwen3 --device cpu \\
        --override-imports torch_rope_override.torch_rope --steps 2 --seq-len 256

Before training torchtitan logs one line per replaced node, one per Qwen3 layer::

    [Override] torch_rope_override.torch_rope: model_spec.model.layers.0.attention.rope CosSinRoPE.Config -> TorchRoPE.Config

and ``trnqwen inspect-logs`` checks there is exactly one per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torchtitan.config import derive, override
from torchtitan.models.common.rope import CosSinRoPE

__all__ = ["TorchRoPE", "rope_bhsd", "torch_rope"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_bhsd(
    q: torch.Tensor, k: torch.Tensor, rope_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel: RoPE on ``[batch, heads, seq, head_dim]`` with a ``[seq, head_dim * 2]`` cache.

    Computed in float32 (the same rotate-half arithmetic as torchtitan, so float32 inputs give
    bit-identical results) and returned in the input dtype.
    """
    head_dim = q.shape[-1]
    if rope_cache.shape[-1] != 2 * head_dim:
        raise ValueError(f"rope cache width {rope_cache.shape[-1]} is not 2 x head_dim ({2 * head_dim})")
    if rope_cache.shape[0] < q.shape[2]:
        raise ValueError(f"rope cache covers {rope_cache.shape[0]} positions, the sequence has {q.shape[2]}")
    cache = rope_cache[: q.shape[2]]
    cos = cache[:, :head_dim]  # [seq, head_dim], broadcast over batch and heads
    sin = cache[:, head_dim:]
    q32, k32 = q.float(), k.float()
    q_out = (q32 * cos) + (_rotate_half(q32) * sin)
    k_out = (k32 * cos) + (_rotate_half(k32) * sin)
    return q_out.type_as(q), k_out.type_as(k)


class TorchRoPE(CosSinRoPE):
    """``CosSinRoPE`` whose rotation runs through :func:`rope_bhsd` in the kernel layout."""

    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        pass

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions is not None:  # per-token positions (packed documents): torchtitan's own path
            return super().forward(query, key, positions)
        sharded = isinstance(query, DTensor)
        q = query.to_local() if sharded else query
        k = key.to_local() if sharded else key
        cache = self.cache.to_local() if isinstance(self.cache, DTensor) else self.cache
        # [b, s, h, d] -> [b, h, s, d] for the kernel, and back
        q_out, k_out = rope_bhsd(q.transpose(1, 2), k.transpose(1, 2), cache)
        q_out, k_out = q_out.transpose(1, 2), k_out.transpose(1, 2)
        if sharded:
            q_out = DTensor.from_local(q_out, query.device_mesh, query.placements, run_check=False)
            k_out = DTensor.from_local(k_out, key.device_mesh, key.placements, run_check=False)
        return q_out, k_out


@override(
    target=CosSinRoPE.Config,
    exact=True,
    description="pure-PyTorch RoPE in the [batch, heads, seq, head_dim] kernel layout",
)
def torch_rope(cfg: CosSinRoPE.Config) -> TorchRoPE.Config:
    return derive(cfg, TorchRoPE.Config)
