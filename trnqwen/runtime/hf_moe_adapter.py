"""hf-v5 on a Qwen3-MoE: the checkpoint adapter torchtitan 0.3.0's Transformers backend lacks.

That backend swaps torchtitan's own ``MoE`` (``GroupedExperts`` + ``TokenChoiceTopKRouter``)
into every HF MoE block, so the model's experts are ``model.model.layers.{i}.mlp.routed_experts
.inner_experts.{w1_EFD,w3_EFD,w2_EDF}`` (3-D, experts first) and its router ``...mlp.router.gate
.weight``; its ``HFTransformerStateDictAdapter`` only strips the ``model.`` prefix, so an HF
checkpoint (per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight``, router ``mlp.gate.weight``)
cannot load and the export is not the Hub layout.  :class:`HFMoeStateDictAdapter` maps both ways
with torchtitan's own ``MoEStateDictAdapter`` helpers (the ones its native Qwen3 adapter uses):
each rank splits / stacks only the experts its FSDP shard holds.  Everything else is the
backend's own prefix rule.  docs/moe.md.
"""

from __future__ import annotations

import re
from typing import Any

from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import HFTransformerStateDictAdapter
from torchtitan.models.utils import MoEStateDictAdapter

# torchtitan GroupedExperts parameter -> the Hub's per-expert projection
_EXPERT_PARAMS = {"w1_EFD": "gate_proj", "w3_EFD": "up_proj", "w2_EDF": "down_proj"}
_TITAN_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.mlp\.routed_experts\.inner_experts\.(w1_EFD|w3_EFD|w2_EDF)$")
_TITAN_ROUTER = re.compile(r"^model\.layers\.(\d+)\.mlp\.router\.gate\.weight$")
_TITAN_BUFFERS = re.compile(r"^model\.layers\.\d+\.mlp\.(expert_bias_E|tokens_per_expert_E)$")
_HF_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_HF_ROUTER = re.compile(r"^model\.layers\.(\d+)\.mlp\.gate\.weight$")
_PROJ_PARAM = {v: k for k, v in _EXPERT_PARAMS.items()}


def _titan_abstract(param: str) -> str:
    return "model.layers.{}.mlp.routed_experts.inner_experts." + param


def _hf_abstract(param: str) -> str:
    return "model.layers.{}.mlp.experts.{}." + _EXPERT_PARAMS[param] + ".weight"


class HFMoeStateDictAdapter(MoEStateDictAdapter, HFTransformerStateDictAdapter):
    """HF checkpoint <-> the Transformers backend's model with torchtitan MoE swapped in."""

    def __init__(self, model_config: Any, hf_assets_path: str | None):
        MoEStateDictAdapter.__init__(self, model_config, hf_assets_path)
        self._tie_word_embeddings = getattr(model_config, "tie_word_embeddings", False)
        self.num_experts = _num_experts(hf_assets_path)

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed.tensor import DTensor

        plain: dict[str, Any] = {}
        out: dict[str, Any] = {}
        for key, value in state_dict.items():
            k = key.removeprefix("model.")
            m = _TITAN_EXPERTS.match(k)
            if m:
                layer, param = m.groups()
                titan, hf = _titan_abstract(param), _hf_abstract(param)
                if isinstance(value, DTensor):
                    self.grouped_expert_weight_placements[titan] = value.placements
                    self.grouped_expert_weight_shape[titan] = value.shape
                    self.grouped_expert_weight_mesh[titan] = value.device_mesh
                    out.update(self._get_local_experts_weights(hf, titan, layer, value))
                else:
                    for e in range(value.shape[0]):
                        out[hf.format(layer, e)] = value[e]
                continue
            m = _TITAN_ROUTER.match(k)
            if m:
                out[f"model.layers.{m.group(1)}.mlp.gate.weight"] = value
                continue
            if _TITAN_BUFFERS.match(k):  # torchtitan's load-balancing state: not an HF tensor
                continue
            plain[key] = value
        out.update(HFTransformerStateDictAdapter.to_hf(self, plain))
        return out

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        plain: dict[str, Any] = {}
        out: dict[str, Any] = {}
        by_layer: dict[str, dict[str, dict[int, Any]]] = {}
        for key, value in hf_state_dict.items():
            m = _HF_EXPERT.match(key)
            if m:
                layer, expert, proj = m.groups()
                titan = _titan_abstract(_PROJ_PARAM[proj])
                by_layer.setdefault(layer, {}).setdefault(titan, {})[int(expert)] = value
                if titan in self.local_experts_indices:
                    stacked = self._concatenate_expert_weights_dtensor(by_layer, titan, layer)
                else:
                    stacked = self._concatenate_expert_weights(by_layer, titan, layer, self.num_experts)
                if stacked is not None:
                    out["model." + titan.format(layer)] = stacked
                continue
            m = _HF_ROUTER.match(key)
            if m:
                out[f"model.model.layers.{m.group(1)}.mlp.router.gate.weight"] = value
                continue
            plain[key] = value
        out.update(HFTransformerStateDictAdapter.from_hf(self, plain))
        return out


def _num_experts(hf_assets_path: str | None) -> int:
    from pathlib import Path

    from trnqwen.assets import moe_layout, read_config_json

    config = read_config_json(Path(hf_assets_path)) if hf_assets_path else None
    layout = moe_layout(config) if config else None
    return layout.num_experts if layout is not None else 0
