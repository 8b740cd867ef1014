"""CPU shims for torchtitan 0.3.0 (see shared/reference/torchtitan-0.3.0-on-cpu.md, items 3-5).

Order matters: :func:`install_cpu_device` must run before any torchtitan module other than
``torchtitan.tools.utils`` is imported, because those modules bind ``device_type`` and
``device_module`` at import time.
"""

from __future__ import annotations

import os
import platform
import resource
import types
from typing import Any


class _CpuProperties:
    def __init__(self) -> None:
        try:
            import psutil

            self.total_memory = int(psutil.virtual_memory().total)
        except Exception:  # pragma: no cover - psutil is a core dependency
            self.total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.name = platform.processor() or platform.machine() or "cpu"


def _peak_rss_bytes() -> int:
    # ru_maxrss is KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def make_cpu_device_module() -> types.ModuleType:
    """A stand-in for ``torch.cuda`` with the calls torchtitan makes on its device module.

    Memory statistics report the process's peak resident set size, so the step line's
    ``memory:`` column means something on CPU.
    """
    mod = types.ModuleType("trnqwen_cpu_device")
    props = _CpuProperties()

    def memory_stats(device: Any = None) -> dict[str, int]:
        peak = _peak_rss_bytes()
        return {
            "active_bytes.all.peak": peak,
            "reserved_bytes.all.peak": peak,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.set_device = lambda device=None: None
    mod.current_device = lambda: 0
    mod.synchronize = lambda device=None: None
    mod.get_device_name = lambda device=None: f"CPU ({props.name})"
    mod.get_device_properties = lambda device=None: props
    mod.memory_stats = memory_stats
    mod.reset_peak_memory_stats = lambda device=None: None
    mod.empty_cache = lambda: None
    mod.memory = types.SimpleNamespace(
        _record_memory_history=lambda *a, **k: None, _snapshot=lambda *a, **k: {}
    )
    return mod


def install_cpu_device() -> None:
    """Point torchtitan at the CPU before the rest of torchtitan is imported."""
    import torchtitan.tools.utils as tt_utils

    tt_utils.device_type = "cpu"
    tt_utils.device_module = make_cpu_device_module()


def install_force_sum_reduction() -> None:
    """FSDP over gloo cannot use ReduceOp.PREMUL_SUM: make every FSDP module reduce with SUM.

    torchtitan calls ``disable_fsdp_gradient_division(model)`` on every FSDP model; wrapping it
    (before the callers import it by name) reaches each FSDP module exactly once.
    """
    import torchtitan.distributed.fsdp as tt_fsdp

    original = tt_fsdp.disable_fsdp_gradient_division
    if getattr(original, "_trnqwen_force_sum", False):
        return

    def disable_division_and_force_sum(model):
        from torch.distributed.fsdp import FSDPModule

        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    disable_division_and_force_sum._trnqwen_force_sum = True  # type: ignore[attr-defined]
    tt_fsdp.disable_fsdp_gradient_division = disable_division_and_force_sum


def install_eager_block_masks() -> None:
    """Build each batch's BlockMask with eager ``create_block_mask``, not torchtitan's compiled one.

    torchtitan wraps ``create_block_mask`` in ``torch.compile``: on CPU its first call traces for
    about 2.6 s in every rank of every run, and the CPU attention (:func:`dense_mask_from_block_mask`,
    ``runtime/cpu_attention.py``) reads only the mask's ``mask_mod`` anyway.  The eager call
    returns the same mask.  Callers imported the name, so each importing module is patched (the
    Transformers backend's in :func:`install_hf_backend_attention`).
    """
    import torchtitan.models.common.attention as attention
    import torchtitan.models.common.decoder as decoder

    attention.create_attention_mask = eager_attention_mask
    decoder.create_attention_mask = eager_attention_mask


def eager_attention_mask(*args: Any, **kwargs: Any):
    """torchtitan's ``create_attention_mask`` without ``torch.compile``."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(*args, **kwargs)


class _TimeWithoutSleep:
    """``time`` for torchtitan's trainer module, whose rank 0 sleeps 2 s after the last step "for
    other ranks to complete" (they are past the last collective by then; torchrun waits for all)."""

    def __getattr__(self, name: str) -> Any:
        import time

        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        return None


def skip_final_sleep() -> None:
    """No 2 s pause at the end of every CPU run (:class:`_TimeWithoutSleep`)."""
    import torchtitan.trainer as trainer

    trainer.time = _TimeWithoutSleep()  # type: ignore[assignment]


def dense_mask_from_block_mask(block_mask: Any, batch: int, q_len: int, kv_len: int, device: Any):
    """The boolean ``(B, 1, Q, KV)`` mask a flex BlockMask stands for, from its ``mask_mod``."""
    from torch.nn.attention.flex_attention import create_mask

    return create_mask(block_mask.mask_mod, batch, 1, q_len, kv_len, device=device)


def sdpa_flex_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    softcap: float | None = None,
    s_aux: Any = None,
    position_bias: Any = None,
    **kwargs: Any,
):
    """Drop-in for transformers' ``flex_attention_forward`` that has a CPU backward.

    HF layout in: ``(B, H, L, D)``; out: ``(B, L, H, D)`` and no LSE, like the original on CPU.
    """
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import BlockMask

    if softcap is not None or s_aux is not None or position_bias is not None:
        raise NotImplementedError("the CPU attention shim supports neither softcap, sinks nor position bias")
    from trnqwen.runtime.override_calls import counter

    counter(HF_ATTENTION_CALLS).ran(module)
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[-2]
    if isinstance(attention_mask, BlockMask):
        mask = dense_mask_from_block_mask(attention_mask, batch, q_len, kv_len, query.device)
    elif attention_mask is not None:
        mask = attention_mask[:, :, :, :kv_len].to(query.dtype)
    else:
        mask = None
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


HF_ATTENTION_CALLS = f"{__name__}.sdpa_flex_attention_forward"  # its [OverrideCalls] name


def install_hf_backend_attention() -> None:
    """Give the Transformers modeling backend an SDPA equivalent of ``flex_attention_forward``.

    Under ``spmd_types`` its per-module kernel calls the name imported into its own module, so
    that module attribute is what must change (the AttentionInterface entry alone is not enough).
    """
    import torchtitan.experiments.transformers_modeling_backend.model as hf_model

    from trnqwen.runtime.override_calls import counter

    hf_model.flex_attention_forward = sdpa_flex_attention_forward
    if hasattr(hf_model, "create_attention_mask"):
        hf_model.create_attention_mask = eager_attention_mask  # see install_eager_block_masks
    counter(HF_ATTENTION_CALLS).arm()  # after step 1: how many attention calls it served
