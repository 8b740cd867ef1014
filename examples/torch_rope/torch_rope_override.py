"""A pure-PyTorch rotary embedding attached through torchtitan's override registry.

The same contract as the NKI example in ``examples/nki_rope/my_neuron_kernels.py``, with the
kernel written in plain PyTorch so it runs anywhere (CPU included). It is the CPU twin of that
example: it takes the same decisions, so testing it here tests what the NKI path does.

* torchtitan hands RoPE ``q``/``k`` as ``[batch, seq, heads, head_dim]``; the kernel works in the
  Hugging Face layout ``[batch, heads, seq, head_dim]`` (what nkilib's ``rope_hf`` wants), so the
  module transposes in and out;
* the rotary cache rows are ``[cos | sin]`` (``head_dim * 2`` wide, torchtitan's ``CosSinRoPE``
  cache).  torchtitan 0.3.0's dataloader yields per-document ``positions`` (they restart at 0 at
  every document packed into a window), so the module gathers one cache row per token: the
  kernel gets ``[batch, seq, head_dim * 2]`` (``[seq, head_dim * 2]`` when every row of the batch
  has the same positions, or when no positions are given: the prefix of the cache);
* ``TorchRoPE`` subclasses ``CosSinRoPE`` with its own ``Config``; the factory returns
  ``derive(cfg, TorchRoPE.Config)`` so every field of the original config is kept.

Use it (torchtitan 0.3.0 names an override by its factory's ``module.function`` path)::

    cd examples/torch_rope
    trnqwen train --backend native --model builtin:tiny-qwen3 --device cpu \\
        --override-imports torch_rope_override.torch_rope --steps 2 --seq-len 256

Before training torchtitan logs one line per replaced node, one per Qwen3 layer::

    [Override] torch_rope_override.torch_rope: model_spec.model.layers.0.attention.rope CosSinRoPE.Config -> TorchRoPE.Config

That proves the module was *installed*, not that its rotation ran.  After the first optimizer
step each rank logs how many calls took the custom path and how many fell back::

    [OverrideCalls] torch_rope_override.torch_rope: calls=8 fallbacks=0 modules=4 rank=0 step=1

``trnqwen inspect-logs`` reads both: one ``[Override]`` line per layer, and ``calls > 0`` with
no fallbacks.  The file imports one thing from trnqwen, its call counter
(``trnqwen.runtime.override_calls.module_counter``, installed wherever trnqwen trains): copy it and
change the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch.distributed.tensor import DTensor
from torchtitan.config import derive, override
from torchtitan.models.common.rope import CosSinRoPE

from trnqwen.contract.override_calls import CALLS_TAG
from trnqwen.runtime.override_calls import ModuleCallCounter, module_counter as counter_for

__all__ = ["CALLS_TAG", "ModuleCallCounter", "TorchRoPE", "counter_for", "gather_rope_cache", "rope_bhsd", "torch_rope"]

OVERRIDE_NAME = f"{__name__}.torch_rope"


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


# --- the kernel -----------------------------------------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_bhsd(
    q: torch.Tensor, k: torch.Tensor, rope_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel: RoPE on ``[batch, heads, seq, head_dim]`` with a ``[(batch,) seq, head_dim * 2]``
    cache (nkilib ``rope_hf``'s contract: a 2-D cache is shared by the batch, a 3-D one has a row
    per token of each sequence).

    Computed in float32 (the same rotate-half arithmetic as torchtitan, so float32 inputs give
    bit-identical results) and returned in the input dtype.
    """
    head_dim, seq = q.shape[-1], q.shape[2]
    if rope_cache.shape[-1] != 2 * head_dim:
        raise ValueError(f"rope cache width {rope_cache.shape[-1]} is not 2 x head_dim ({2 * head_dim})")
    if rope_cache.dim() == 3 and rope_cache.shape[0] != q.shape[0]:
        raise ValueError(f"rope cache batch {rope_cache.shape[0]} is not q's batch {q.shape[0]}")
    if rope_cache.dim() not in (2, 3):
        raise ValueError(f"rope cache must be [(batch,) seq, head_dim*2], got shape {tuple(rope_cache.shape)}")
    if rope_cache.shape[-2] < seq:
        raise ValueError(f"rope cache covers {rope_cache.shape[-2]} positions, the sequence has {seq}")
    cache = rope_cache[..., :seq, :]
    if cache.dim() == 3:  # [batch, seq, 2d] -> [batch, 1, seq, 2d]: the same table for every head
        cache = cache.unsqueeze(1)
    cos = cache[..., :head_dim]
    sin = cache[..., head_dim:]
    q32, k32 = q.float(), k.float()
    q_out = (q32 * cos) + (_rotate_half(q32) * sin)
    k_out = (k32 * cos) + (_rotate_half(k32) * sin)
    return q_out.type_as(q), k_out.type_as(k)


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


# --- the torchtitan module and its override --------------------------------------------------------


class TorchRoPE(CosSinRoPE):
    """``CosSinRoPE`` whose rotation runs through :func:`rope_bhsd` in the kernel layout."""

    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        override_name: str = OVERRIDE_NAME  # whose [OverrideCalls] line counts this module

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

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sharded = isinstance(query, DTensor)
        q = query.to_local() if sharded else query
        k = key.to_local() if sharded else key
        cache = self.cache.to_local() if isinstance(self.cache, DTensor) else self.cache
        rope_cache, why = gather_rope_cache(cache, positions, q.shape[0], q.shape[1])
        if rope_cache is None:
            self.fallback_calls.add_(1)
            self.counter.fell_back(why)
            return super().forward(query, key, positions)
        self.custom_calls.add_(1)
        # [b, s, h, d] -> [b, h, s, d] for the kernel, and back
        q_out, k_out = rope_bhsd(q.transpose(1, 2), k.transpose(1, 2), rope_cache)
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
    return derive(cfg, TorchRoPE.Config, override_name=OVERRIDE_NAME)
