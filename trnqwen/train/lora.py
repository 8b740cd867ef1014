"""LoRA, planned on the launcher side: what is adapted, on which backend, with how many parameters.

Users name targets the way peft, vLLM and every peer do, by Hugging Face module names
(``q_proj ... down_proj``, ``all-linear`` for all seven).  This module is the one place that maps
them onto each backend and refuses a set a backend cannot express exactly (never adapting
something the user did not ask for):

* **native**: the model is built with separate ``wq``/``wk``/``wv`` projections
  (``fuse_qkv=False``, the state-dict layout torchtitan's HF adapter reads), so q, k and v each get
  their own adapter exactly as peft's do.  torchtitan's config names: ``wq``, ``wkv`` (one config
  builds both ``wk`` and ``wv``, so k and v go together), ``wo``, ``w1`` (gate), ``w3`` (up),
  ``w2`` (down).
* **hf-v5**: adapters are injected into the Transformers model by module name, any subset.
* **hf-trainer**: peft itself, any subset.
* **nki-moe**: torchtitan-neuron's fused ``wqkv`` (q, k and v share one A: all three or none)
  and ``wo``; routed experts are grouped 3-D parameters, not Linear layers, so MLP targets are
  out of reach and ``all-linear`` means attention only there (the plan says so).

The spec travels to the ranks as JSON inside the generated config module
(:func:`render_attach_lines`), so a hand re-run of that module trains the same adapter.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Optional

from trnqwen.constants import LORA_ALL_LINEAR, LORA_TARGETS
from trnqwen.errors import UsageError

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
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


def spec_from_config(cfg: Any) -> Optional[LoraSpec]:
    if not cfg.lora:
        return None
    return LoraSpec(
        rank=cfg.lora_rank,
        alpha=float(cfg.resolved_lora_alpha),
        dropout=float(cfg.lora_dropout),
        targets=targets_of(cfg.lora_targets),
        seed=int(cfg.seed if cfg.seed is not None else 0),
        base_model=str(cfg.model),
    )


def backend_targets(spec: LoraSpec, backend: str, *, moe: bool = False) -> tuple[str, ...]:
    """The HF targets the backend adapts for ``spec``; UsageError for a set it cannot express."""
    targets = spec.targets
    asked_all = targets == LORA_TARGETS
    if backend == "nki-moe" or moe:
        mlp = [t for t in targets if t in MLP]
        if mlp and not asked_all:
            raise UsageError(
                f"--lora-targets {','.join(mlp)}: a Qwen3-MoE's MLPs are routed experts (grouped 3-D weights, "
                "not Linear layers), which LoRA cannot reach",
                hint="adapt attention: --lora-targets q_proj,k_proj,v_proj,o_proj (or all-linear)",
            )
        targets = tuple(t for t in targets if t in ATTENTION)
    if backend == "native":
        if ("k_proj" in targets) != ("v_proj" in targets):
            raise UsageError(
                "--lora-targets: the native backend builds k_proj and v_proj from one torchtitan config (wkv), "
                "so it adapts both or neither",
                hint="add the other one, or use --backend hf-v5 / hf-trainer for any subset",
            )
    if backend == "nki-moe":
        qkv = [t for t in ("q_proj", "k_proj", "v_proj") if t in targets]
        if qkv and len(qkv) != 3:
            raise UsageError(
                f"--lora-targets {','.join(qkv)}: nki-moe models fuse q, k and v into one projection (wqkv), "
                "so LoRA adapts all three or none",
                hint="use q_proj,k_proj,v_proj,o_proj, o_proj alone, or all-linear",
            )
    return targets


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


def adapter_params(dims: Any, spec: LoraSpec, targets: tuple[str, ...]) -> int:
    """Adapter parameters: r x (in + out) for every adapted projection of every layer."""
    h, hd, r = dims.dim, dims.head_dim, spec.rank
    q_out, kv_out = dims.n_heads * hd, dims.n_kv_heads * hd
    ffn = dims.ffn_dim or 0
    sizes = {
        "q_proj": h + q_out, "k_proj": h + kv_out, "v_proj": h + kv_out, "o_proj": q_out + h,
        "gate_proj": h + ffn, "up_proj": h + ffn, "down_proj": ffn + h,
    }
    if dims.num_experts:  # MoE layers have no dense MLP for an adapter to sit on
        sizes.update(gate_proj=0, up_proj=0, down_proj=0)
    return dims.n_layers * r * sum(sizes[t] for t in targets)


def plan_note(spec: LoraSpec, targets: tuple[str, ...], *, backend: str, trainable: Optional[int],
              total: Optional[int]) -> str:
    total = total + trainable if trainable and total else total  # as the ranks count: base + adapters
    share = f": {trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.2f}%)" if trainable and total else ""
    dropped = [t for t in spec.targets if t not in targets]
    frozen = f"; {', '.join(dropped)} out of reach (routed experts stay frozen)" if dropped else ""
    return (
        f"LoRA rank {spec.rank}, alpha {spec.alpha:g}, dropout {spec.dropout:g}, targets {','.join(targets)} "
        f"on {backend}{share}{frozen}; the export is a PEFT adapter"
    )


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


def finish_export(cfg: Any, exported: Any, assets_dir: Any, extra: dict) -> Optional[tuple[str, str]]:
    """After a LoRA run: its export must be the adapter (a base-model export would be the base,
    unchanged); ``--merge`` writes the merged folder beside it in a child process (the launcher
    never imports torch), recorded in ``extra["merged"]``.  (ended_by, error) when either fails."""
    from trnqwen.ckpt.lora import is_adapter_folder

    if not is_adapter_folder(exported):
        return "no adapter", f"a LoRA run exported {exported} without its adapter (no adapter_config.json)"
    if cfg.merge:
        from trnqwen.ckpt.merge import merge_in_child

        merged = extra["merged"] = merge_in_child(exported, assets_dir)
        if "error" in merged:
            return "merge failed", f"the adapter was exported to {exported}, but merging it failed: {merged['error']}"
    return None


def render_attach_lines(spec: LoraSpec, *, backend: str, targets: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(imports, body lines) for the generated config module: attach LoRA to the config."""
    spec = LoraSpec(**{**asdict(spec), "targets": targets})
    return (
        ["from trnqwen.runtime.lora import attach_lora"],
        [
            f"# LoRA (trnqwen.train.lora): frozen base, adapters on {','.join(targets)}; the export is a PEFT adapter",
            f"attach_lora(config, {spec.to_json()!r}, backend={backend!r})",
        ],
    )


__all__ = [
    "LoraSpec", "spec_from_config", "targets_of", "backend_targets", "titan_target_names", "adapter_params",
    "plan_note", "vllm_rank_warning", "render_attach_lines", "finish_export", "LOG_MARK", "VLLM_RANKS", "LOG_LINE_RE", "log_line",
]
