"""LoRA inside the ranks of the torchtitan backends (native, hf-v5, nki-moe).

The generated config module calls :func:`attach_lora` and passes :class:`LoraHook` to
``trnqwen_config`` (:mod:`trnqwen.adapters.lora.plan` renders both), which

* **native / nki-moe**: rewrites the model config with torchtitan's own ``LoRAConverter``
  (adapters ``lora_a``/``lora_b`` on the target Linear configs, every other module frozen);
* **hf-v5**: injects :class:`LoraLinear` into the Transformers model by module name just before
  it is parallelized, so FSDP shards the adapters with the rest (torchtitan's Transformers backend
  takes no converters); when torchtitan's sharding pass gives a ``LoraLinear`` its base linear's
  ``_sharding_config``, the adapters take theirs from it (torchtitan's own LoRA rule), so every
  parameter has one before its completeness check and ``model.parallelize``;
* wraps ``parallelize_fn`` to (a) freeze everything but the adapters after parallelisation
  (torchtitan 0.3.0's ``spmd_types`` backend re-registers parameters as trainable, pytorch/torchtitan
  PR #4267) and (b) initialise the adapters after the model's own init: A from the seed and the
  module's Hugging Face name (the same numbers on every backend and rank count), B zero;
* wraps ``post_optimizer_build_fn`` to prove what the optimizer updates: one ``[LoRA]`` line per
  rank (``trainable N of M parameters (P%)``), and a stop before step 1 when anything but the
  adapters is trainable;
* through :class:`LoraHook`, a trainer hook, tells trnqwen's checkpointer
  (:mod:`trnqwen.runtime.trainer_checkpoint`, chosen by the config; it never imports this module):
  the initial HF load skips adapter keys (:func:`without_adapters`: the base checkpoint has none),
  and the HF export at the last step is the PEFT adapter (:func:`export_adapter`,
  :mod:`trnqwen.contract.peft_adapter`) instead of the base model, which torchtitan's Qwen3 ``to_hf`` would
  write silently without the adapter.

Resumable checkpoints (DCP) keep base + adapters + optimizer state, so ``--resume`` is exact.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.contract.lora import LOG_MARK, LoraSpec, log_line, titan_target_names
from trnqwen.contract.peft_adapter import adapter_init, clean_fqn, hf_module_of_titan, is_adapter_key
from trnqwen.runtime.trainer import TrainerHook

if TYPE_CHECKING:
    from torchtitan.components.checkpointer.dcp import CheckpointManager
    from torchtitan.protocols.sharding import ShardingConfig

_state: dict[str, Any] = {"spec": None, "backend": None, "exported": 0}


def _log(message: str) -> None:
    from torchtitan.tools.logging import logger

    logger.info(message)


def attach_lora(config: Any, spec_json: str, *, backend: str) -> Any:
    """Make ``config`` (a torchtitan trainer config) train ``spec``'s adapter; returns it."""
    spec = LoraSpec.from_json(spec_json)
    _state.update(spec=spec, backend=backend)
    model_spec = config.model_spec
    if backend in ("native", "nki-moe"):
        from torchtitan.components.lora import LoRAConverter

        names = titan_target_names(spec.targets, fused_qkv=backend == "nki-moe")
        converter = LoRAConverter.Config(rank=spec.rank, alpha=spec.alpha, target_modules=names).build()
        model_spec.model = converter.convert(model_spec.model)
    model_spec.parallelize_fn = _wrap_parallelize(model_spec.parallelize_fn, spec, backend)
    model_spec.post_optimizer_build_fn = _wrap_post_optimizer(model_spec.post_optimizer_build_fn, spec)
    return config


# --- the adapter modules -----------------------------------------------------------------------


def _lora_linear_cls():
    import torch
    from torch import nn

    class LoraLinear(nn.Linear):
        """An ``nn.Linear`` whose state keeps ``weight`` under its own name (the HF checkpoint
        loads unchanged) plus ``lora_A``/``lora_B`` (peft's names): y = W x + s B A drop(x)."""

        def __init__(self, base: nn.Linear, rank: int, scaling: float, dropout: float):
            nn.Module.__init__(self)
            self.in_features, self.out_features = base.in_features, base.out_features
            self.weight = base.weight
            self.bias = base.bias
            self.weight.requires_grad_(False)
            if self.bias is not None:
                self.bias.requires_grad_(False)
            device, dtype = base.weight.device, base.weight.dtype
            self.lora_A = nn.Linear(self.in_features, rank, bias=False, device=device, dtype=dtype)
            self.lora_B = nn.Linear(rank, self.out_features, bias=False, device=device, dtype=dtype)
            self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.scaling = scaling

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = nn.functional.linear(x, self.weight, self.bias)
            return out + self.scaling * self.lora_B(self.lora_A(self.lora_dropout(x)))

        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, value)
            if name == "_sharding_config" and value is not None:  # torchtitan's sharding pass (spmd_types)
                self.lora_A._sharding_config, self.lora_B._sharding_config = adapter_sharding(value)

    return LoraLinear


def adapter_sharding(base_config: ShardingConfig) -> tuple[ShardingConfig, ShardingConfig]:
    """(A's, B's) ``ShardingConfig`` from the base linear's, as torchtitan's own LoRA derives them
    (colwise base: A replicated, B sharded like the base's output; rowwise: A sharded like the
    base's input, B replicated); a base without a weight placement: both replicated."""
    import spmd_types as spmd
    from torchtitan.components.lora import _lora_adapter_sharding
    from torchtitan.models.common.decoder_sharding import dense_param_placement
    from torchtitan.protocols.sharding import ShardingConfig

    a_cfg, b_cfg = _lora_adapter_sharding(base_config)
    replicated = ShardingConfig(state_shardings={"weight": dense_param_placement(tp=spmd.R)})
    return a_cfg or replicated, b_cfg or replicated


def inject_hf_adapters(model: Any, spec: LoraSpec) -> int:
    """Replace every target ``nn.Linear`` of a Transformers model by a LoraLinear; returns how many."""
    from torch import nn

    cls = _lora_linear_cls()
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in spec.targets and type(child) is nn.Linear:
                setattr(module, child_name, cls(child, spec.rank, spec.scaling, spec.dropout))
                count += 1
    return count


def _add_titan_dropout(model: Any, p: float) -> int:
    """torchtitan's LoRALinear has no dropout: run its adapter path on dropout(x)."""
    import types

    from torch import nn

    count = 0
    for module in model.modules():
        if hasattr(module, "lora_a") and hasattr(module, "lora_b") and hasattr(module, "_lora_scaling"):
            module.lora_dropout = nn.Dropout(p)
            base_forward = type(module).__mro__[1].forward

            def forward(self, x, _base=base_forward):
                return _base(self, x) + self._lora_scaling * self.lora_b(self.lora_a(self.lora_dropout(x)))

            module.forward = types.MethodType(forward, module)
            count += 1
    return count


# --- parallelize / init / optimizer --------------------------------------------------------------


def _wrap_parallelize(original, spec: LoraSpec, backend: str):
    def parallelize(model, **kwargs):
        injected = inject_hf_adapters(model, spec) if backend == "hf-v5" else 0
        if backend != "hf-v5" and spec.dropout > 0:
            _add_titan_dropout(model, spec.dropout)
        model = original(model, **kwargs)
        freeze_base(model)
        init_weights = model.init_weights

        def init_then_adapters(*args, **kw):
            out = init_weights(*args, **kw)
            initialise_adapters(model, spec, backend)
            return out

        model.init_weights = init_then_adapters
        if injected:
            _state["injected"] = injected
        return model

    return parallelize


def freeze_base(model: Any) -> None:
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_key(name))


def _adapter_modules(model: Any, backend: str):
    """(HF module path, A parameter, B parameter) for every adapter in the model."""
    for fqn, module in model.named_modules():
        a = getattr(module, "lora_a", None)
        a = a if a is not None else getattr(module, "lora_A", None)
        b = getattr(module, "lora_b", None)
        b = b if b is not None else getattr(module, "lora_B", None)
        if a is None or b is None:
            continue
        yield hf_module_path(fqn, backend), a.weight, b.weight


def hf_module_path(fqn: str, backend: str) -> str:
    """The Hugging Face module path of an adapted module's torchtitan FQN."""
    if backend == "hf-v5":  # HFTransformerModel keeps the HF model as .model
        return clean_fqn(fqn).removeprefix("model.")
    return hf_module_of_titan(fqn)


def _fill(param: Any, full: Any) -> None:
    """Copy the full tensor ``full`` into ``param``, which may be a sharded DTensor."""
    import torch

    with torch.no_grad():
        try:
            from torch.distributed.tensor import DTensor, Shard
        except ImportError:  # pragma: no cover
            DTensor = ()  # type: ignore[assignment]
        if isinstance(param, DTensor):
            local = full
            coords = param.device_mesh.get_coordinate()
            for mesh_dim, placement in enumerate(param.placements):
                if isinstance(placement, Shard):
                    size = param.device_mesh.size(mesh_dim)
                    chunks = torch.chunk(local, size, dim=placement.dim)
                    local = chunks[coords[mesh_dim]] if coords[mesh_dim] < len(chunks) else local.narrow(placement.dim, 0, 0)
            target = param.to_local()
            target.copy_(local.to(dtype=target.dtype, device=target.device).reshape(target.shape))
        else:
            param.copy_(full.to(dtype=param.dtype, device=param.device).reshape(param.shape))


def initialise_adapters(model: Any, spec: LoraSpec, backend: str) -> int:
    """A from (seed, module name), B zero: identical on every backend and rank count."""
    import torch

    count = 0
    for path, a, b in _adapter_modules(model, backend):
        _fill(a, adapter_init(spec.seed, path, tuple(a.shape)))
        _fill(b, torch.zeros(tuple(b.shape)))
        count += 1
    _state["initialised"] = count
    return count


def _global_numel(param: Any) -> int:
    return int(param.numel()) if not hasattr(param, "full_tensor") else int(param.shape.numel())


def _wrap_post_optimizer(original, spec: LoraSpec):
    def post_optimizer_build(optimizers, model_parts, parallel_dims):
        if original is not None:
            original(optimizers, model_parts, parallel_dims)
        report_trainable(optimizers, model_parts, spec)

    return post_optimizer_build


def report_trainable(optimizers: Any, model_parts: list, spec: LoraSpec) -> None:
    """Log the ``[LoRA]`` line; stop before step 1 if the optimizer updates anything else."""
    names = {id(p): n for m in model_parts for n, p in m.named_parameters()}
    total = sum(_global_numel(p) for m in model_parts for p in m.parameters())
    updated = [p for opt in getattr(optimizers, "optimizers", [optimizers]) for g in opt.param_groups for p in g["params"]]
    trainable = sum(_global_numel(p) for p in updated)
    stray = sorted({names.get(id(p), "?") for p in updated if not is_adapter_key(names.get(id(p), ""))})
    adapters = sum(1 for m in model_parts for n, _ in m.named_parameters() if is_adapter_key(n)) // 2
    rank = int(os.environ.get("RANK", "0"))
    _log(log_line(trainable=trainable, total=total, spec=spec, adapters=adapters,
                  initialised=_state.get("initialised", 0), rank=rank))
    if stray or adapters == 0 or _state.get("initialised", 0) != adapters:
        what = (
            f"{len(stray)} non-adapter parameter(s) would be trained, e.g. {', '.join(stray[:3])}" if stray
            else "no adapter was built" if adapters == 0
            else f"{_state.get('initialised', 0)} of {adapters} adapters were initialised"
        )
        raise RuntimeError(f"{LOG_MARK} refusing to train: {what}")


# --- checkpoints ----------------------------------------------------------------------------------


def without_adapters(state_dict: dict) -> dict:
    """The state dict to ask of the published HF base: it has no adapter keys, so the adapters keep
    their init (:meth:`LoraHook.hf_load_state`, asked by trnqwen's checkpointer)."""
    return {k: v for k, v in state_dict.items() if not is_adapter_key(k)}


def active() -> bool:
    """Whether this rank trains LoRA adapters (its HF export is then the PEFT adapter folder)."""
    return _state["spec"] is not None


def export_adapter(manager: CheckpointManager, folder: str) -> None:
    """Gather the adapters (full tensors, fp32) and write the PEFT folder on rank 0."""
    import torch
    import torch.distributed as dist

    from trnqwen.contract.peft_adapter import write_adapter

    spec: LoraSpec = _state["spec"]
    model_parts = manager.states["model"].model
    tensors: dict[str, Any] = {}
    for part in model_parts:
        for path, a, b in _adapter_modules(part, _state["backend"]):
            full_a = a.full_tensor() if hasattr(a, "full_tensor") else a
            full_b = b.full_tensor() if hasattr(b, "full_tensor") else b
            tensors[path] = (full_a.detach().to(torch.float32).cpu(), full_b.detach().to(torch.float32).cpu())
    if not dist.is_initialized() or dist.get_rank() == 0:
        dims = _fused_dims(model_parts[0])
        dtype = str(getattr(manager, "export_dtype", "") or "").removeprefix("torch.") or None  # the checkpoint's
        written = write_adapter(folder, tensors, spec, fused_dims=dims, dtype=dtype)
        _state["exported"] = len(written)
        _log(f"{LOG_MARK} exported a PEFT adapter: {len(written)} tensors for {len(tensors)} module(s) to {folder}")
    if dist.is_initialized():
        dist.barrier()


def _fused_dims(model: Any) -> Optional[tuple[int, int, int]]:
    """(n_heads, n_kv_heads, head_dim) for splitting a fused wqkv adapter (nki-moe), else None."""
    for module in model.modules():
        if hasattr(module, "wqkv") and hasattr(module, "head_dim"):
            attn = next((m for m in model.modules() if hasattr(m, "n_heads") and hasattr(m, "n_kv_heads")), None)
            if attn is not None:
                return int(attn.n_heads), int(attn.n_kv_heads), int(module.head_dim)
    return None


class LoraHook(TrainerHook):
    """LoRA's part in trnqwen's checkpointer, passed by the generated config module beside
    :func:`attach_lora`: the published base loads without adapter keys, and the last step's HF
    export is the PEFT adapter folder."""

    name = "lora"

    def hf_load_state(self, state_dict: dict) -> dict:
        return without_adapters(state_dict) if active() else state_dict

    def hf_export(self, checkpointer: CheckpointManager, checkpoint_id: str) -> bool:
        if not active():
            return False
        export_adapter(checkpointer, checkpoint_id)
        return True


__all__ = ["attach_lora", "LoraHook", "inject_hf_adapters", "initialise_adapters", "freeze_base", "export_adapter", "active"]
