"""LoRA's contract: the spec the launcher hands the ranks, and the ``[LoRA]`` line they log.

The launcher plans the adapter (:mod:`trnqwen.adapters.lora.plan`: targets per backend, refusals) and
hands the ranks a :class:`LoraSpec` (JSON in the generated config module, or the hf-trainer
spec); every rank logs one :func:`log_line` before step 1 and the log judge reads it back with
:func:`read_log_line`.  Both sides count adapter parameters with :func:`adapter_params`.  The PEFT
adapter folder the ranks export is :mod:`trnqwen.contract.peft_adapter`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Optional

from trnqwen.constants import LORA_ALL_LINEAR, LORA_TARGETS
from trnqwen.titan_compat import FlavorDims

# torchtitan's config-tree names for each HF target (the non-fused attention layout).
TITAN_NAMES = {"q_proj": "wq", "o_proj": "wo", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# Ranks vLLM's --max-lora-rank accepts (vllm/config/lora.py).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LOG_MARK = "[LoRA]"


@dataclass(frozen=True)
class LoraSpec:
    """Everything the ranks need to build, initialise and export the adapter."""

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]  # Hugging Face names, LORA_TARGETS order
    seed: int
    base_model: str  # the Hub id (or path) the run started from: adapter_config's base_model_name_or_path

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "targets": list(self.targets)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "LoraSpec":
        data = json.loads(text)
        return cls(**{**data, "targets": tuple(data["targets"])})


def targets_of(text: str) -> tuple[str, ...]:
    """The HF module names a (validated) ``lora_targets`` value stands for."""
    if text == LORA_ALL_LINEAR:
        return LORA_TARGETS
    return tuple(name for name in LORA_TARGETS if name in text.split(","))


def titan_target_names(targets: tuple[str, ...], *, fused_qkv: bool) -> list[str]:
    """torchtitan's ``LoRAConverter`` target names (the last segment of a Linear config's FQN)."""
    names: list[str] = []
    if fused_qkv and any(t in targets for t in ("q_proj", "k_proj", "v_proj")):
        names.append("wqkv")
    for t in targets:
        if t in ("k_proj", "v_proj"):
            if not fused_qkv and "wkv" not in names:
                names.append("wkv")
        elif t == "q_proj":
            if not fused_qkv:
                names.append("wq")
        else:
            names.append(TITAN_NAMES[t])
    return names


def projection_shapes(dims: FlavorDims) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection an adapter can sit on (an MoE's dense MLP: none)."""
    h, hd = dims.dim, dims.head_dim
    q_out, kv_out = dims.n_heads * hd, dims.n_kv_heads * hd
    ffn = dims.ffn_dim or 0
    shapes = {
        "q_proj": (h, q_out), "k_proj": (h, kv_out), "v_proj": (h, kv_out), "o_proj": (q_out, h),
        "gate_proj": (h, ffn), "up_proj": (h, ffn), "down_proj": (ffn, h),
    }
    if dims.num_experts:  # MoE layers have no dense MLP for an adapter to sit on
        shapes.update(gate_proj=(0, 0), up_proj=(0, 0), down_proj=(0, 0))
    return shapes


def adapter_params(dims: FlavorDims, spec: LoraSpec, targets: tuple[str, ...]) -> int:
    """Adapter parameters: r x (in + out) for every adapted projection of every layer."""
    shapes = projection_shapes(dims)
    return dims.n_layers * spec.rank * sum(sum(shapes[t]) for t in targets)


def rank_above_size(dims: FlavorDims, rank: int, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """The targets whose projection cannot hold a rank-``rank`` update (rank > min(in, out)): B A of
    such a layer has rank min(in, out) at most, the rest are parameters that add nothing."""
    shapes = projection_shapes(dims)
    return {t: shapes[t] for t in targets if 0 < min(shapes[t]) < rank}


def vllm_rank_warning(rank: int) -> Optional[str]:
    if rank in VLLM_RANKS:
        return None
    return (
        f"LoRA rank {rank} is not one vLLM serves (--max-lora-rank takes {', '.join(map(str, VLLM_RANKS))}): "
        "peft and transformers load the adapter, vLLM refuses it"
    )


# The one line every rank logs before step 1, on every backend; logs.judge reads it back.
LOG_LINE_RE = re.compile(
    r"\[LoRA\] trainable (?P<trainable>[\d,]+) of (?P<total>[\d,]+) parameters \((?P<percent>[\d.]+)%\), "
    r"rank (?P<rank>\d+), alpha (?P<alpha>[\d.e+-]+), dropout (?P<dropout>[\d.e+-]+), adapters (?P<adapters>\d+), "
    r"targets (?P<targets>[\w,]+), initialised (?P<initialised>\d+)"
)


def log_line(*, trainable: int, total: int, spec: LoraSpec, adapters: int, initialised: int, rank: int) -> str:
    """``[LoRA] trainable 155,648 of 1,205,632 parameters (12.91%), rank 16, ...`` (total includes
    the adapters, as peft's ``print_trainable_parameters`` counts)."""
    return (
        f"{LOG_MARK} trainable {trainable:,} of {total:,} parameters ({100 * trainable / max(total, 1):.2f}%), "
        f"rank {spec.rank}, alpha {spec.alpha:g}, dropout {spec.dropout:g}, adapters {adapters}, "
        f"targets {','.join(spec.targets)}, initialised {initialised} (rank {rank})"
    )


_PROCESS_RANK_RE = re.compile(r"\(rank (\d+)\)\s*$")


def read_log_line(text: str) -> Optional[tuple[Optional[int], dict]]:
    """:func:`log_line` read back: (the process rank it names at its end, None when it names none;
    its numbers and settings), or None for any other line."""
    m = LOG_LINE_RE.search(text)
    if m is None:
        return None
    rec: dict = {k: int(m.group(k).replace(",", "")) for k in ("trainable", "total", "rank", "adapters", "initialised")}
    rec.update(percent=float(m.group("percent")), alpha=float(m.group("alpha")), dropout=float(m.group("dropout")),
               targets=m.group("targets").split(","))
    process = _PROCESS_RANK_RE.search(text)
    return (int(process.group(1)) if process else None), rec
