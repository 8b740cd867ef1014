"""Rank entry point: ``python -m trnqwen.runtime.entry --module M --config F [torchtitan flags]``.

``--trnqwen-device cpu`` (stripped before torchtitan parses argv) installs the CPU shims first:
device selection before any other torchtitan import, sum reductions for FSDP over gloo, the
dense-mask SDPA attention override for native models (through torchtitan's override registry)
and an SDPA ``flex_attention_forward`` for the Transformers backend.  On every device the
Transformers backend gets its rotary buffers re-initialised after materialisation
(:mod:`trnqwen.runtime.hf_rope`), and every run gets exact resume and preemption handling
(:mod:`trnqwen.runtime.resume_state`) and the learning rate at the end of each step line
(:mod:`trnqwen.runtime.lr_log`).  Otherwise the entry is a pass-through to ``torchtitan.train.main`` (it only expands recipe-style bare-module
``--override.imports`` entries for torchtitan versions that want ``module.function``).

It never runs in the launcher process, so touching the Neuron runtime here is fine.
"""

from __future__ import annotations

import sys
from typing import Optional

DEVICE_FLAG = "--trnqwen-device"


def split_own_flags(argv: list[str]) -> tuple[Optional[str], list[str]]:
    """(device or None, argv without trnqwen's own flags)."""
    device = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == DEVICE_FLAG and i + 1 < len(argv):
            device = argv[i + 1]
            i += 2
            continue
        if arg.startswith(DEVICE_FLAG + "="):
            device = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return device, rest


def _patch_config_parsing(device: Optional[str]) -> None:
    """Adjust the parsed config before torchtitan builds anything from it."""
    from torchtitan.config import manager
    from torchtitan.config.override import _REGISTRY

    from trnqwen import titan_compat as compat

    original = manager.ConfigManager.parse_args
    if getattr(original, "_trnqwen", False):
        return

    def parse_args(self, args=None):
        config = original(self, args)
        if hasattr(config, "hf_model"):  # the Transformers backend, on every device
            from trnqwen.runtime import hf_rope

            hf_rope.install()
        imports = list(config.override.imports)
        if compat.detect().override_import_style == "function":
            imports = compat.expand_override_imports(imports, _REGISTRY)
        if device == "cpu":
            _adapt_for_cpu(config, imports)
        config.override.imports = imports
        return config

    parse_args._trnqwen = True  # type: ignore[attr-defined]
    manager.ConfigManager.parse_args = parse_args


def _adapt_for_cpu(config, imports: list) -> None:
    from torchtitan.models.common.attention import FlexAttention

    if hasattr(config, "hf_model"):
        from trnqwen.runtime.cpu import install_hf_backend_attention

        install_hf_backend_attention()
        return
    model_spec = getattr(config, "model_spec", None)
    if model_spec is not None and any(True for _ in model_spec.model.traverse(FlexAttention.Config)):
        import trnqwen.runtime.cpu_attention as cpu_attention  # registers the override

        names = [entry if isinstance(entry, str) else entry[0] for entry in imports]
        if cpu_attention.OVERRIDE_TARGET not in names:
            imports.append(cpu_attention.OVERRIDE_TARGET)


def main(argv: Optional[list[str]] = None) -> None:
    device, rest = split_own_flags(list(sys.argv[1:] if argv is None else argv))
    if device == "cpu":
        from trnqwen.runtime.cpu import (
            install_cpu_device, install_eager_block_masks, install_force_sum_reduction, skip_final_sleep,
        )

        install_cpu_device()  # before any other torchtitan import
        install_force_sum_reduction()
        install_eager_block_masks()
        skip_final_sleep()
    _patch_config_parsing(device)
    from trnqwen.runtime import resume_state

    resume_state.install()  # RNG in checkpoints, exports apart from resume points, preemption
    from trnqwen.runtime import lr_log

    lr_log.install()  # the step line ends with the step's learning rate (as every backend's does)
    sys.argv = [sys.argv[0], *rest]
    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
