"""peft's reading of adapter_config.json, in plain Python: which base modules an adapter reaches,
with which rank and scaling, and the LoraConfig settings trnqwen cannot reproduce (refused by name).

``trnqwen merge`` computes ``W + scaling * B @ A`` with these rules and ``verify-ckpt`` checks an
adapter with them, so an adapter verify-ckpt calls OK is one merge reproduces exactly as peft's
``merge_and_unload`` does (tests/test_merge.py checks each setting against peft itself).  The rules
follow peft (``tuners_utils.check_target_module_exists``, ``utils.other.get_pattern_key``,
``lora.layer.LoraLayer.update_layer``):

* a module is adapted when ``target_modules`` names it (a list: the module path or its end; a
  string: a regex over the whole path; ``all-linear``: every Linear but the output head), it is not
  in ``exclude_modules``, and, for a list, its layer index is in ``layers_to_transform`` (found
  after ``layers_pattern``, else the first ``.<name>.<index>.`` of the path);
* its rank and alpha are ``rank_pattern`` / ``alpha_pattern``'s first key matching the path's end,
  else ``r`` / ``lora_alpha``; its scaling ``alpha / r``, or ``alpha / sqrt(r)`` with ``use_rslora``.

Every field of peft's LoraConfig is named below (:data:`APPLIED`, :data:`NO_EFFECT`,
:data:`REFUSED`): a field peft adds later is caught by the test that compares the lists with peft's.
No torch, no peft: the launcher and verify-ckpt's header checks read it.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional, Union

# Fields that decide which modules are adapted and by how much: applied as peft applies them.
APPLIED = ("r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "target_modules", "exclude_modules",
           "layers_to_transform", "layers_pattern")
# Fields that do not change the merged weights of a Qwen3 model (why, for each).
NO_EFFECT = {
    "task_type": "metadata", "peft_type": "checked: LORA", "auto_mapping": "metadata", "peft_version": "metadata",
    "base_model_name_or_path": "metadata", "revision": "metadata", "inference_mode": "loading mode",
    "lora_dropout": "training only",
    "fan_in_fan_out": "peft turns it off for torch.nn.Linear layers (it is for GPT-2's Conv1D)",
    "bias": "Qwen3's projections have no bias to train; a bias tensor in the file is refused as a non-LoRA key",
    "init_lora_weights": "an initialisation that leaves the base as it is (the others are refused)",
    "eva_config": "initialisation only", "corda_config": "only with init_lora_weights 'corda' (refused)",
    "lora_ga_config": "only with init_lora_weights 'lora_ga' (refused)",
    "loftq_config": "only with init_lora_weights 'loftq' (refused)",
    "megatron_config": "Megatron layers only", "megatron_core": "Megatron layers only",
    "runtime_config": "loading only", "qalora_group_size": "only with use_qalora (refused)",
    "ensure_weight_tying": "only with modules_to_save or trainable_token_indices (refused)",
}
# Fields whose non-empty value changes the model in a way a plain W + s B A merge cannot reproduce.
REFUSED = {
    "use_dora": "DoRA rescales each merged column by a learned magnitude",
    "modules_to_save": "whole modules replaced by trained copies",
    "lora_bias": "lora_B carries a bias of its own",
    "target_parameters": "LoRA on raw parameters (MoE experts), not Linear layers",
    "trainable_token_indices": "trained rows of the embedding",
    "layer_replication": "layers duplicated in the model",
    "use_qalora": "QA-LoRA pools the input for quantized layers",
    "alora_invocation_tokens": "activated LoRA applies only after its invocation tokens: peft cannot merge it either",
    "velora_config": "a LoRA variant (VeLoRA)", "monteclora_config": "a LoRA variant (MonteCLoRA)",
    "use_bdlora": "block-diagonal LoRA", "arrow_config": "Arrow routing between adapters", "kasa_config": "a LoRA variant (KaSA)",
}
# init_lora_weights values that leave the base weights alone; pissa, olora, corda, loftq and
# lora_ga rewrite the base weights when peft builds the adapter, so the adapter is a delta from
# weights that exist nowhere on disk.
SAFE_INITS = (True, False, "gaussian", "eva", "orthogonal", "mica")


def refusals(config: dict[str, Any]) -> list[str]:
    """One problem per setting merge (and vLLM) cannot reproduce, naming the field."""
    out = [f"{name} is set: {why}; trnqwen merges plain LoRA adapters only"
           for name, why in REFUSED.items() if config.get(name)]
    init = config.get("init_lora_weights", True)
    if not any(init is safe or init == safe for safe in SAFE_INITS):
        out.append(f"init_lora_weights is {init!r}: that initialisation rewrites the base weights, so the adapter is a "
                   "delta from weights that are not on disk; convert it to a plain LoRA adapter with peft "
                   "(save_pretrained(..., path_initial_model_for_weight_conversion=...))")
    return out


def _layer_index(module: str, patterns: Union[None, str, list[str]]) -> Optional[int]:
    if not patterns:
        m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module)
    else:
        m = None
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            m = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module)
            if m is not None:
                break
    return int(m.group("idx")) if m else None


def _excluded(module: str, config: dict[str, Any]) -> bool:
    exclude = config.get("exclude_modules")
    if not exclude:
        return False
    if isinstance(exclude, str):
        return re.fullmatch(exclude, module) is not None
    return module in exclude or any(module.endswith(f".{name}") for name in exclude)


def is_targeted(module: str, config: dict[str, Any]) -> bool:
    """Whether peft gives the base module ``module`` (an HF module path) an adapter."""
    if _excluded(module, config):
        return False
    targets = config.get("target_modules")
    if targets == "all-linear":
        targets = None if module == "lm_head" else [module.rsplit(".", 1)[-1]]
    if targets is None:
        return False
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    if module in targets:
        return True
    if not any(module.endswith(f".{name}") for name in targets):
        return False
    layers = config.get("layers_to_transform")
    if layers is None or (isinstance(layers, list) and not layers):
        return True
    index = _layer_index(module, config.get("layers_pattern"))
    if index is None:
        return False
    return index == layers if isinstance(layers, int) else index in layers


def _pattern_value(pattern: Optional[dict[str, object]], module: str) -> object:
    for key, value in (pattern or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return None


def rank_of(module: str, config: dict[str, Any]) -> Any:
    """The module's rank as peft reads it (``rank_pattern``, else ``r``); not checked here."""
    found = _pattern_value(config.get("rank_pattern"), module)
    return config.get("r") if found is None else found


def scaling_of(module: str, config: dict[str, Any]) -> float:
    """peft's ``scaling``: alpha / r, or alpha / sqrt(r) with use_rslora (per-module patterns applied)."""
    r = float(rank_of(module, config))
    alpha = _pattern_value(config.get("alpha_pattern"), module)
    alpha = float(config.get("lora_alpha", 8) if alpha is None else alpha)
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


__all__ = ["APPLIED", "NO_EFFECT", "REFUSED", "SAFE_INITS", "refusals", "is_targeted", "rank_of", "scaling_of"]
