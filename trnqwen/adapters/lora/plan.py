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

The spec (:class:`trnqwen.contract.lora.LoraSpec`, with the ``[LoRA]`` line the ranks log)
travels to the ranks as JSON inside the generated config module (:func:`render_attach_lines`: the
``attach_lora`` call and :class:`~trnqwen.adapters.lora.titan.LoraHook`), so a hand re-run of that
module trains the same adapter; the hf-trainer spec carries it beside :data:`HF_TRAINER_MODULE`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from trnqwen.assets import base_identity
from trnqwen.config import RunConfig
from trnqwen.constants import LORA_TARGETS
from trnqwen.contract.lora import LoraSpec, adapter_params, rank_above_size, targets_of, vllm_rank_warning
from trnqwen.errors import UsageError
from trnqwen.titan_compat import FlavorDims

# the hf-trainer ranks' LoRA code (the spec's lora_module): imported by name, runtime/ never imports adapters/
HF_TRAINER_MODULE = "trnqwen.adapters.lora.hf_trainer"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def spec_from_config(cfg: RunConfig) -> Optional[LoraSpec]:
    if not cfg.lora:
        return None
    return LoraSpec(
        rank=cfg.lora_rank,
        alpha=float(cfg.resolved_lora_alpha),
        dropout=float(cfg.lora_dropout),
        targets=targets_of(cfg.lora_targets),
        seed=int(cfg.seed if cfg.seed is not None else 0),
        base_model=base_identity(cfg.model, cfg.assets_dir)[0],  # what --assets holds, when not --model
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


def trainable(cfg: RunConfig, dims: FlavorDims) -> Optional[int]:
    """The adapters' parameter count for ``cfg``'s LoRA run on a base of ``dims`` (None: not a LoRA
    run, or targets the backend refuses: the recipe says why)."""
    spec = spec_from_config(cfg)
    if spec is None:
        return None
    try:
        targets = backend_targets(spec, cfg.backend, moe=bool(dims.num_experts))
    except UsageError:
        return None
    return adapter_params(dims, spec, targets)


def preflight(cfg: RunConfig, dims: Optional[FlavorDims]) -> list[tuple[str, str, str]]:
    """(severity ``error``/``warning``, problem, fix) of a LoRA run's settings, for the preflight
    report: a rank above a target's size, a rank vLLM does not serve, a randomly initialised base.
    ``dims``: the base's (None: config.json unread; the memory check says so)."""
    out: list[tuple[str, str, str]] = []
    try:
        spec = spec_from_config(cfg)
        targets = backend_targets(spec, cfg.backend, moe=bool(dims.num_experts)) if dims and spec else ()
    except UsageError:
        targets = ()  # the recipe refuses the target set with the reason
    too_small = rank_above_size(dims, cfg.lora_rank, tuple(targets)) if dims and targets else {}
    if too_small:
        most = min(min(shape) for shape in too_small.values())
        layers = ", ".join(f"{t} ({i} -> {o})" for t, (i, o) in too_small.items())
        out.append(("error", f"--lora-rank {cfg.lora_rank} is above the size of {layers}: an update of such a "
                    f"layer has rank {most} at most, the rest of the adapter would be parameters that add nothing",
                    f"use --lora-rank {most} or less, or leave {', '.join(too_small)} out of --lora-targets"))
    warning = vllm_rank_warning(cfg.lora_rank)
    if warning:
        out.append(("warning", warning, "use --lora-rank 8, 16, 32 or 64 to serve it with vLLM"))
    if not cfg.finetune:
        out.append(("warning", "LoRA without --finetune trains adapters on a randomly initialised base",
                    "add --finetune to adapt the published weights"))
    return out


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


def finish_export(cfg: RunConfig, exported: Path, assets_dir: Path, extra: dict, *,
                  merge: Callable[[Path, Path], dict]) -> Optional[tuple[str, str]]:
    """After a LoRA run: its export must be the adapter (a base-model export would be the base,
    unchanged); ``--merge`` writes the merged folder beside it with ``merge(adapter, base)`` (the
    launcher hands in ``ckpt.merge.merge_in_child``: a child process, the launcher never imports
    torch), recorded in ``extra["merged"]``.  (ended_by, error) when either fails."""
    from trnqwen.contract.peft_adapter import is_adapter_folder

    if not is_adapter_folder(exported):
        return "no adapter", f"a LoRA run exported {exported} without its adapter (no adapter_config.json)"
    if cfg.merge:
        merged = extra["merged"] = merge(exported, assets_dir)
        if "error" in merged:
            return "merge failed", f"the adapter was exported to {exported}, but merging it failed: {merged['error']}"
    return None


def render_attach_lines(spec: LoraSpec, *, backend: str,
                        targets: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
    """(imports, body lines, trainer hooks) for the generated config module: attach LoRA to the
    config; its hook (``LoraHook()``) joins ``trnqwen_config(config, hooks=[...])``."""
    spec = LoraSpec(**{**asdict(spec), "targets": targets})
    return (
        ["from trnqwen.adapters.lora.titan import LoraHook, attach_lora"],
        [
            f"# LoRA (trnqwen.adapters.lora): frozen base, adapters on {','.join(targets)}; the export is a PEFT adapter",
            f"attach_lora(config, {spec.to_json()!r}, backend={backend!r})",
        ],
        ["LoraHook()"],  # the base loaded without adapter keys; the HF export is the adapter
    )


__all__ = ["spec_from_config", "backend_targets", "trainable", "preflight", "plan_note", "render_attach_lines", "finish_export", "HF_TRAINER_MODULE"]
