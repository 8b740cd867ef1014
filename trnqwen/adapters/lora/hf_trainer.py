"""LoRA inside the ranks of the ``hf-trainer`` backend: peft on the Transformers model.

The hf-trainer spec names this module (``lora_module``, set by :mod:`trnqwen.adapters.lora.plan`);
:mod:`trnqwen.runtime.hf_trainer` imports it by that name and calls :func:`attach`, :func:`callback`
and :func:`export` (the ranks never import ``trnqwen.adapters`` by name).

As the Neuron docs' TRL + PEFT tutorial does, the adapters come from peft itself:
``get_peft_model(model, LoraConfig(r, lora_alpha, lora_dropout, target_modules=<HF names>))`` on the
loaded model (sharded at load by ``DistributedConfig`` or not).  Then trnqwen's own parts:

* :func:`attach` initialises every adapter as the other backends do: A from
  :func:`trnqwen.contract.peft_adapter.adapter_init` (seed, HF module path), B zero, so one seed gives the same
  adapters on native, hf-v5 and hf-trainer, whatever the rank count.
* :func:`check_trainable` (from :func:`callback`, once the optimizer exists, before step 1) logs
  the ``[LoRA]`` line on every rank (full, unsharded parameter counts) and stops the run with one
  error when the optimizer would update anything but the adapters.
* :func:`export` writes the last step as the PEFT adapter folder (:func:`trnqwen.contract.peft_adapter.write_adapter`,
  the same key names and float32 tensors as the other backends), not the base model.

On a model sharded at load the adapters peft adds after ``fully_shard`` are plain replicated
tensors next to the DTensor base; transformers' Trainer broadcasts them from rank 0 and averages
their gradients (``Trainer._sync_replicated_trainable_parameters``).  The resumable DCP checkpoint
(:mod:`trnqwen.runtime.hf_trainer_checkpoint`) holds base + adapters + optimizer state, so
``--resume`` is exact.  Tensor parallelism is refused before start (``LORA_TP_PROBLEM``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Optional

from trnqwen.contract.lora import LOG_MARK, LoraSpec, log_line
from trnqwen.contract.peft_adapter import PEFT_PREFIX, adapter_init, clean_fqn, is_adapter_key

ADAPTER_NAME = "default"  # peft's name for the one adapter get_peft_model adds


def peft_config(spec: LoraSpec) -> Any:
    """peft's ``LoraConfig`` for ``spec`` (targets: Hugging Face module names)."""
    from peft import LoraConfig

    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.targets),
        bias="none",
        task_type="CAUSAL_LM",
    )


def hf_module_path(name: str) -> str:
    """``base_model.model.model.layers.0.self_attn.q_proj`` -> ``model.layers.0.self_attn.q_proj``."""
    name = clean_fqn(name)
    return name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name


def adapter_modules(model: Any) -> Iterator[tuple[str, Any, Any]]:
    """(HF module path, A weight, B weight) of every LoRA layer of a peft model."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A:
            yield hf_module_path(name), module.lora_A[ADAPTER_NAME].weight, module.lora_B[ADAPTER_NAME].weight


def initialise(model: Any, spec: LoraSpec) -> int:
    """A from (seed, module name), B zero; returns how many adapters."""
    import torch

    count = 0
    with torch.no_grad():
        for path, a, b in adapter_modules(model):
            if hasattr(a, "to_local") or hasattr(b, "to_local"):
                raise RuntimeError(f"{LOG_MARK} {path}: a sharded adapter (tensor parallelism) is not supported on hf-trainer")
            a.copy_(adapter_init(spec.seed, path, tuple(a.shape)).to(dtype=a.dtype, device=a.device))
            b.zero_()
            count += 1
    return count


def attach(model: Any, spec: LoraSpec) -> tuple[Any, int]:
    """(the peft model around ``model``, adapters initialised): only the adapters stay trainable."""
    import warnings

    from peft import get_peft_model

    with warnings.catch_warnings():  # peft asks the model a question transformers 5 renamed
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        peft_model = get_peft_model(model, peft_config(spec))
    return peft_model, initialise(peft_model, spec)


def _numel(param: Any) -> int:
    """A parameter's full size (a DTensor's ``shape`` is the global one)."""
    return math.prod(param.shape)


def check_trainable(model: Any, optimizer: Any, spec: LoraSpec, *, initialised: int, rank: int) -> tuple[str, Optional[str]]:
    """(the ``[LoRA]`` line, the reason to refuse training or None), from what the optimizer updates."""
    names = {id(p): n for n, p in model.named_parameters()}
    total = sum(_numel(p) for p in model.parameters())
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the torch one
    updated = list({id(p): p for g in inner.param_groups for p in g["params"]}.values())
    trainable = sum(_numel(p) for p in updated)
    stray = sorted({names.get(id(p), "?") for p in updated if not is_adapter_key(names.get(id(p), ""))})
    adapters = sum(1 for _ in adapter_modules(model))
    in_optimizer = {id(p) for p in updated}
    missing = sorted(n for path, a, b in adapter_modules(model) for n, p in ((f"{path}.lora_A", a), (f"{path}.lora_B", b))
                     if id(p) not in in_optimizer)
    line = log_line(trainable=trainable, total=total, spec=spec, adapters=adapters, initialised=initialised, rank=rank)
    problem = None
    if stray:
        problem = f"{len(stray)} non-adapter parameter(s) would be trained, e.g. {', '.join(stray[:3])}"
    elif adapters == 0:
        problem = f"no adapter was built: no module named {', '.join(spec.targets)} in the model"
    elif initialised != adapters:
        problem = f"{initialised} of {adapters} adapters were initialised"
    elif missing:
        problem = f"{len(missing)} adapter weight(s) are not in the optimizer, e.g. {', '.join(missing[:3])}"
    return line, problem


def callback(spec: LoraSpec, *, initialised: int, rank: int, log: Callable[[str], None]) -> Any:
    """A TrainerCallback: the ``[LoRA]`` line and the trainable check, after the optimizer is built
    (and a checkpoint loaded) and before step 1."""
    from transformers import TrainerCallback

    class LoraCheck(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            line, problem = check_trainable(model, optimizer, spec, initialised=initialised, rank=rank)
            log(line)
            if problem:
                raise RuntimeError(f"{LOG_MARK} refusing to train: {problem}")

    return LoraCheck()


def _full(tensor: Any) -> Any:
    import torch

    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # collective: every rank calls it
    return full.detach().to(device="cpu", dtype=torch.float32)


def export(model: Any, spec: LoraSpec, folder: Any, *, rank: int, dtype: Optional[str] = None) -> Optional[list[str]]:
    """Write the PEFT adapter folder on rank 0 (every rank calls this), in ``dtype`` (the base
    checkpoint's); the written key names there."""
    from trnqwen.contract.peft_adapter import write_adapter

    tensors = {path: (_full(a), _full(b)) for path, a, b in adapter_modules(model)}
    if rank != 0:
        return None
    return write_adapter(folder, tensors, spec, dtype=dtype)


__all__ = ["ADAPTER_NAME", "peft_config", "hf_module_path", "adapter_modules", "initialise", "attach",
           "check_trainable", "callback", "export"]
