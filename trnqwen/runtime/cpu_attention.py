"""The native backend's CPU attention, registered through torchtitan's own override registry.

FlexAttention has no backward on CPU.  :func:`cpu_dense_attention` replaces every
``FlexAttention.Config`` in the model tree with :class:`DenseMaskAttention`, which turns the
block mask's ``mask_mod`` into a dense boolean mask and calls SDPA (with ``enable_gqa``).
Activated by listing ``trnqwen.runtime.cpu_attention.cpu_dense_attention`` in
``override.imports`` (the rank entry does that on CPU).  Every call is counted and the rank logs
``[OverrideCalls] <name>: calls=C fallbacks=0 modules=<layers> ...`` after its first step
(:mod:`trnqwen.runtime.override_calls`): the module has no fallback, it runs or raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchtitan.config import derive
from torchtitan.models.common.attention import FlexAttention

from trnqwen.runtime.cpu import dense_mask_from_block_mask
from trnqwen.runtime.override_calls import counter
from trnqwen import titan_compat as compat

OVERRIDE_TARGET = f"{__name__}.cpu_dense_attention"
CALLS = counter(compat.override_name(__name__, "cpu_dense_attention"))


class DenseMaskAttention(FlexAttention):
    """FlexAttention's contract (``(B, L, N, H)`` in and out, a BlockMask) computed with SDPA."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        pass

    def forward(  # type: ignore[override]
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks,
        score_mod=None,
        scale: float | None = None,
        enable_gqa: bool = False,
        out_transform=None,
        **kwargs,
    ) -> torch.Tensor:
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError("the CPU dense attention supports neither score_mod nor out_transform")
        CALLS.ran(self)
        q = q_BLNH.transpose(1, 2)
        k = k_BLNH.transpose(1, 2)
        v = v_BLNH.transpose(1, 2)
        mask = dense_mask_from_block_mask(attention_masks, q.shape[0], q.shape[2], k.shape[2], q.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        return out.transpose(1, 2)


def cpu_dense_attention(cfg: FlexAttention.Config) -> DenseMaskAttention.Config:
    CALLS.arm()  # the override is being applied in this rank: report its calls after step 1
    return derive(cfg, DenseMaskAttention.Config)


compat.register_override(
    cpu_dense_attention,
    name="cpu_dense_attention",
    target=FlexAttention.Config,
    description="dense-mask SDPA (FlexAttention has no backward on CPU)",
)
