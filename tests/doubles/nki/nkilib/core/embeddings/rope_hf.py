"""Double of ``nkilib.core.embeddings.rope_hf``: the kernel's documented contract in PyTorch.

q/k are ``[batch, heads, seq, head_dim]``; the result is written into ``q_out``/``k_out`` and
returned.  Cosines/sines come either as ``cos``/``sin`` (``[(batch,) seq, head_dim]``) or packed
as ``rope_cache`` (``[(batch,) seq, head_dim * 2]``, cos first).  Forward:
``y = [x1, x2] * [cos1, cos2] + [-x2, x1] * [sin1, sin2]``; backward (``backward=True``):
``dx = [g1, g2] * [cos1, cos2] + [g2 * sin2, -g1 * sin1]``.  The kernel asserts that the
sequence length is a multiple of 128 x the number of logical-core shards it was launched on.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

PMAX = 128  # nl.tile_size.pmax


class _Kernel:
    """What ``@nki.jit`` gives torch-neuronx: ``func`` and its signature ``sign``."""

    def __init__(self, func):
        self.func = func
        self.sign = inspect.signature(func)
        self.__name__ = func.__name__

    def __call__(self, *args, **kwargs):
        raise RuntimeError("an NKI kernel runs only through wrap_nki or on a Neuron device")


def kernel_assert(cond: bool, message: str) -> None:
    if not cond:
        raise AssertionError(message)


def _num_shards() -> int:
    from torch_neuronx import current_grid

    grid = current_grid()
    return int(grid[0]) if grid else 1


def _rope_hf(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    cos: Optional[torch.Tensor] = None,
    sin: Optional[torch.Tensor] = None,
    rope_cache: Optional[torch.Tensor] = None,
    backward: bool = False,
):
    num_shards = _num_shards()
    kernel_assert(q.dim() == 4, f"apply_rope only supports 4D tensors, got input shape {tuple(q.shape)}")
    kernel_assert(q.shape[-1] == k.shape[-1], f"Head dim mismatch: q={q.shape[-1]}, k={k.shape[-1]}")
    head_dim = q.shape[-1]
    if rope_cache is not None:
        kernel_assert(rope_cache.shape[-1] == head_dim * 2,
                      f"Packed rope_cache expects head_dim*2={head_dim * 2}, got {rope_cache.shape[-1]}")
        kernel_assert(cos is None and sin is None, "Expected either rope_cache or separate cos/sin tensors, got both")
        cos, sin = rope_cache[..., :head_dim], rope_cache[..., head_dim:]
    else:
        kernel_assert(cos is not None and sin is not None, "Expected either rope_cache or separate cos/sin tensors, got none")
        kernel_assert(cos.shape == sin.shape, f"Shape of cos {tuple(cos.shape)} doesn't match sin {tuple(sin.shape)}")
    kernel_assert(cos.dim() == 2 or (cos.dim() == 3 and cos.shape[0] == q.shape[0]),
                  f"rope_cache or cos tensor batch size {tuple(cos.shape)} doesn't match q batch size {tuple(q.shape)}")
    kernel_assert(cos.shape[-2] >= q.shape[2],
                  f"rope_cache or cos tensor seq len {cos.shape[-2]} smaller than q seq len {q.shape[2]}")
    kernel_assert(q.shape[2] % (PMAX * num_shards) == 0,
                  f"seq len must be multiple of 128 * LNC={num_shards}, got {q.shape[2]}")
    seq = q.shape[2]
    cos = cos[..., :seq, :]
    sin = sin[..., :seq, :]
    if cos.dim() == 3:  # per-batch tables broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    half = head_dim // 2
    for x, out in ((q, q_out), (k, k_out)):
        result = x * cos
        if not backward:
            result[..., :half] = result[..., :half] - x[..., half:] * sin[..., :half]
            result[..., half:] = result[..., half:] + x[..., :half] * sin[..., half:]
        else:
            result[..., :half] = result[..., :half] + x[..., half:] * sin[..., half:]
            result[..., half:] = result[..., half:] - x[..., :half] * sin[..., :half]
        out.copy_(result)
    return q_out, k_out


rope_hf = _Kernel(_rope_hf)
rope_hf.func.__name__ = "rope_hf"
