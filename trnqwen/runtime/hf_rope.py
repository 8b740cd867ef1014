"""Re-initialise Hugging Face rotary-embedding buffers after torchtitan materialises the model.

torchtitan 0.3.0's Transformers backend builds the model on the meta device, then
``to_empty()`` + ``init_states()``.  ``inv_freq`` is a non-persistent buffer computed in the
rotary module's ``__init__``, so after ``to_empty()`` it holds whatever memory it got.
``init_states`` recomputes it only for modules with a ``rope_init_fn`` attribute, and
transformers 5.x's Qwen3 rotary module keeps that function local (no attribute): RoPE then runs
on garbage frequencies.  Measured here: step-1 loss differed run to run on identical weights
and data (7.678-7.719), and about one run in eight hit NaN at step 1.

This recomputes ``inv_freq`` (and ``original_inv_freq``) from the module's own config with the
same functions its ``__init__`` uses, for every rotary module torchtitan skipped, once each model
part is initialised (trnqwen's trainer calls :func:`after_model_init` at the end of torchtitan's
``Trainer.__init__``; nothing runs a forward before).  After the first step the rank logs
``[OverrideCalls] trnqwen.runtime.hf_rope: calls=C fallbacks=F modules=M ...``: ``calls`` counts
model parts that had at least one rotary module re-initialised, ``modules`` how many modules were
re-initialised, ``fallbacks`` model parts that had none (the fix did nothing there).
"""

from __future__ import annotations

from typing import Any

from trnqwen.runtime.override_calls import counter

CALLS = counter(__name__)


def rope_parameters_fn(module: Any):
    """The function the module's ``__init__`` used to compute ``inv_freq`` (None if unknown)."""
    fn = getattr(module, "rope_init_fn", None)
    if fn is not None:
        return fn
    rope_type = getattr(module, "rope_type", "default")
    if rope_type == "default" and hasattr(module, "compute_default_rope_parameters"):
        return module.compute_default_rope_parameters
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS.get(rope_type)


def reinit_rotary_buffers(model: Any) -> int:
    """Recompute every rotary module's frequency buffers in place; returns how many were fixed."""
    import torch

    fixed = 0
    for module in model.modules():
        if not hasattr(module, "inv_freq") or not hasattr(module, "config"):
            continue
        fn = rope_parameters_fn(module)
        if fn is None:
            continue
        inv_freq, scaling = fn(module.config)
        with torch.no_grad():
            for name in ("inv_freq", "original_inv_freq"):
                buf = getattr(module, name, None)
                if isinstance(buf, torch.Tensor) and buf.shape == inv_freq.shape:
                    buf.copy_(inv_freq.to(device=buf.device, dtype=buf.dtype))
        module.attention_scaling = scaling
        fixed += 1
    return fixed


def arm() -> None:
    """The ``[OverrideCalls]`` line is due after the first step (the Transformers backend's runs)."""
    CALLS.arm()


def after_model_init(model_parts: list) -> None:
    """Re-initialise the rotary buffers of each model part torchtitan just initialised (trnqwen's
    trainer, :mod:`trnqwen.runtime.trainer`, calls this right after torchtitan's ``__init__``)."""
    for part in model_parts:
        model = getattr(part, "model", part)
        rotary = [m for m in model.modules() if hasattr(m, "inv_freq") and hasattr(m, "config")]
        if reinit_rotary_buffers(model):
            CALLS.ran(*rotary)
        else:
            CALLS.fell_back("init_states found no rotary module with inv_freq and config to re-initialise")
