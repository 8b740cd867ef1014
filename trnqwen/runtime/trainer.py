"""trnqwen's torchtitan Trainer: torchtitan extended through its own config, never patched.

torchtitan 0.3.0 builds everything from ``Configurable`` configs: ``torchtitan.train.main`` parses
``--module/--config`` plus CLI overrides into the config the module's function returns (tyro parses
into *that* config's own class, so a subclass config keeps working with every ``--section.key``
flag) and runs ``config.build()``.  The generated config module ends with
``return trnqwen_config(config, hooks=[...])``: :func:`trnqwen_config` turns torchtitan's config
into the same values under trnqwen's classes, so that ``build()`` makes

* :class:`TrnqwenTrainer` (or, for the Transformers backend, the same mixin over torchtitan's
  ``HFTransformerTrainer``; any other trainer a base config names gets the mixin the same way),
* :class:`~trnqwen.runtime.trainer_checkpoint.TrnqwenCheckpointManager` (``config.checkpoint``),
* :class:`~trnqwen.runtime.trainer_metrics.TrnqwenMetricsProcessor` (``config.metrics``),
* :class:`TrnqwenValidator` (``config.validator``).

Trainer hooks (:class:`TrainerHook`) are what a training method or an adapter adds in the ranks (a
preference method's: its batch fields, a pass before step 1, its values; LoRA's: the HF base loaded
without adapter keys, the adapter as the HF export); the generated module imports them and passes them in
``config.hooks``, so this package never imports a method or an adapter.

The order of everything trnqwen adds, in one place (:data:`HOOK_ORDER`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Iterable, Optional

import tyro
from torchtitan.components.validate import Validator
from torchtitan.trainer import Trainer

from trnqwen.runtime import resume_state
from trnqwen.runtime.trainer_parts import TrainerAttached, as_trnqwen_config, same_values

if TYPE_CHECKING:
    from torchtitan.components.checkpointer.dcp import CheckpointManager

HOOK_ORDER = (
    # building (TrnqwenTrainer.__init__)
    "config: override imports expanded for this torchtitan (titan_compat), CPU attention override added "
    "(--trnqwen-device cpu), before torchtitan applies the overrides",
    "torchtitan's Trainer.__init__ (model, optimizer, checkpointer, metrics, validator: trnqwen's subclasses)",
    "hf-v5: rotary buffers re-initialised after the model's init (runtime.hf_rope)",
    "MoE: the first grouped GEMM of each rank logs the [MoE] line (runtime.qwen3_native)",
    "metrics processor, validator and checkpointer get the trainer's hooks; hook.on_init(trainer)",
    # train(): torchtitan's loop
    "checkpoint load: each hook.checkpoint_states(trainer) joins the saved state; world-size change skips "
    "data position + RNG + those per-rank states; HF base load asks each hook.hf_load_state (LoRA: its "
    "adapter keys skipped); "
    "RNG restored; then hook.after_checkpoint_load(trainer) (e.g. a reference pass)",
    "the step's batches: the dataloader's passed through each hook.batches(trainer, batches), then torchtitan's "
    "batch generator (tokens, data-loading time) "
    "(e.g. GRPO's rollout: prompts in, scored completion rows out, all of a step's before its first forward)",
    "each step's batch: hook.on_batch(trainer, input_dict, 'train') before torchtitan's post-processing "
    "(e.g. a method's batch fields taken out for its loss); the dataloader's iterator start leaves the RNG alone",
    "each logged step: hook.step_values(trainer, 'train') on every rank -> TensorBoard/W&B, torchtitan's "
    "step line + '  lr: <value>', hook.log_lines (a method's own line), rank 0's metrics-stream 'step' record",
    "checkpoint save: fault drill, torchtitan's save (last step: resume point + HF export beside it, "
    "unless a hook.hf_export writes it: LoRA's PEFT adapter), then preemption agreed by all ranks -> resumable save, the preempted line, stop",
    "validation: hook.on_batch(..., 'val') per batch, then step_values(trainer, 'val') -> validate line, "
    "hook.log_lines, the 'validation' record",
    "loop condition: stops after the step a preemption signal was agreed at",
)


class TrainerHook:
    """What a training method (or an adapter) adds inside torchtitan ranks; every method is optional.

    ``name`` prefixes the hook's values (``<name>/<value>``: TensorBoard, the metrics stream);
    ``method = True`` says the hook is the run's training method (the stream's header names it).
    """

    name: str = ""
    method: bool = False

    def on_init(self, trainer: Trainer) -> None:
        """After torchtitan's Trainer is built (model, optimizer, checkpointer, validator)."""

    def after_checkpoint_load(self, trainer: Trainer) -> None:
        """Right after the checkpoint load at the start of ``train()`` (also with checkpoints off)."""

    def hf_load_state(self, state_dict: dict) -> dict:
        """The state dict a load of published HF weights fills (the base's initial load, a reference
        reloaded from it): ``state_dict``, or less (LoRA: without its adapters, which the base lacks)."""
        return state_dict

    def hf_export(self, checkpointer: CheckpointManager, checkpoint_id: str) -> bool:
        """True when the hook wrote the HF export at ``checkpoint_id`` itself (LoRA: the PEFT adapter
        folder); False: torchtitan's own ``to_hf`` save writes it."""
        return False

    def on_batch(self, trainer: Trainer, input_dict: dict, mode: str) -> None:
        """Each batch before the forward (``mode``: ``"train"`` or ``"val"``); may take keys out."""

    def batches(self, trainer: Trainer, batches: Iterable) -> Iterable:
        """The dataloader's training batches ``(input_dict, labels)`` (CPU tensors), read by
        torchtitan's train step ``gradient_accumulation_steps`` at its start (``trainer.step`` is the
        step's): returns them, or the batches to train on instead (torchtitan counts their tokens
        and the time each took to come as data loading)."""
        return batches

    def checkpoint_states(self, trainer: Trainer) -> dict[str, Any]:
        """DCP ``Stateful`` objects a checkpoint keeps beside the model (asked at the checkpoint load,
        after ``on_init``): per-rank state, skipped when the world size changed."""
        return {}

    def step_values(self, trainer: Trainer, mode: str) -> dict[str, float]:
        """Called on EVERY rank at each logged step or validation: the values, summed over ranks
        by the hook itself (it may all-reduce), named without the prefix."""
        return {}

    def log_lines(self, step: int, mode: str) -> list[str]:
        """Text lines after torchtitan's step (or validate) line, from the last ``step_values``."""
        return []

    def describe(self) -> dict[str, str]:
        """What each value means (the metrics stream's header)."""
        return {}

    def to_dict(self) -> dict:  # torchtitan's Config.to_dict (printed config, W&B) asks each value
        return {"hook": f"{type(self).__module__}.{type(self).__qualname__}"}


_RUN: dict[str, Optional[str]] = {"device": None}


def configure(*, device: Optional[str]) -> None:
    """The rank entry's own flags (``--trnqwen-device``), read when the trainer is built."""
    _RUN["device"] = device


# --- the trainer ---------------------------------------------------------------------------------


class TrnqwenTrainerMixin:
    """Everything trnqwen adds to a torchtitan Trainer (order: :data:`HOOK_ORDER`)."""

    config: Any
    hooks: list

    def __init__(self, config: Trainer.Config) -> None:
        prepare_config(config, _RUN["device"])
        self.hooks = list(getattr(config, "hooks", ()) or ())
        super().__init__(config)  # type: ignore[call-arg]
        if hasattr(config, "hf_model"):
            from trnqwen.runtime import hf_rope

            hf_rope.after_model_init(self.model_parts)  # type: ignore[attr-defined]
        from trnqwen.runtime import qwen3_native

        qwen3_native.observe_experts(self.model_parts)  # type: ignore[attr-defined]
        for name in ("metrics_processor", "validator", "checkpointer"):  # trnqwen's (trnqwen_config)
            part = getattr(self, name, None)
            if isinstance(part, TrainerAttached):
                part.attach(self, self.hooks)  # type: ignore[arg-type]
        for hook in self.hooks:
            hook.on_init(self)

    def post_dataloading_process(self, input_dict, labels):
        for hook in self.hooks:
            hook.on_batch(self, input_dict, "train")
        return super().post_dataloading_process(input_dict, labels)  # type: ignore[misc]

    def batch_generator(self, data_iterable):
        batches = resume_state.rng_neutral(data_iterable)
        for hook in self.hooks:
            batches = hook.batches(self, batches)
        return super().batch_generator(batches)  # type: ignore[misc]

    def should_continue_training(self) -> bool:
        return not resume_state.preempted() and super().should_continue_training()  # type: ignore[misc]


def _hooks_field() -> Any:
    return field(default_factory=list)


def _to_dict_over(base_cls: type):
    """``to_dict`` of a config class with ``hooks`` (torchtitan's prints the config and hands it
    to W&B as JSON): the base's, with each hook as its own ``to_dict``."""

    def to_dict(self) -> dict[str, Any]:
        out = base_cls.to_dict(self)
        out["hooks"] = [hook.to_dict() if hasattr(hook, "to_dict") else repr(hook) for hook in self.hooks]
        return out

    return to_dict


HooksType = Annotated[list, tyro.conf.Suppress]


class TrnqwenTrainer(TrnqwenTrainerMixin, Trainer):
    """torchtitan's Trainer with trnqwen's additions (module doc)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        hooks: HooksType = _hooks_field()
        """Trainer hooks (:class:`TrainerHook`): what the run's method adds in the ranks."""

        to_dict = _to_dict_over(Trainer.Config)


@functools.lru_cache(maxsize=None)
def trainer_over(owner: type) -> type:
    """trnqwen's trainer over ``owner`` (a torchtitan Trainer subclass, e.g. the Transformers
    backend's ``HFTransformerTrainer``): the same mixin, its config class with ``hooks`` added."""
    if owner is Trainer:
        return TrnqwenTrainer
    if issubclass(owner, TrnqwenTrainerMixin):
        return owner
    config_cls = _with_hooks(owner.Config, "Config", f"Trnqwen{owner.__name__}.Config")
    return type(f"Trnqwen{owner.__name__}", (TrnqwenTrainerMixin, owner), {"Config": config_cls, "__module__": __name__})


def _with_hooks(base_config: type, name: str, qualname: str) -> type:
    """A config dataclass over ``base_config`` with a ``hooks`` field (and its ``to_dict``)."""
    namespace = {
        "__annotations__": {"hooks": HooksType},
        "hooks": _hooks_field(),
        "to_dict": _to_dict_over(base_config),
        "__module__": __name__,
        "__qualname__": qualname,
    }
    return dataclass(kw_only=True, slots=True)(type(name, (base_config,), namespace))


def _config_over(base_cls: type) -> type:
    """The config class adding ``hooks`` to ``base_cls`` (which may be a trainer's config subclass
    holding more fields, e.g. the Transformers backend's ``hf_model``), owned by trnqwen's trainer."""
    owner = base_cls._owner
    trainer = trainer_over(owner)
    if base_cls is owner.Config:
        return trainer.Config
    return _derived_config(base_cls, trainer)


@functools.lru_cache(maxsize=None)
def _derived_config(base_cls: type, trainer: type) -> type:
    config_cls = _with_hooks(base_cls, f"Trnqwen{base_cls.__name__}", f"Trnqwen{base_cls.__name__}")
    config_cls._owner = trainer
    return config_cls


def trnqwen_config(config: Trainer.Config, *, hooks: Iterable[TrainerHook] = (),
                   backend: Optional[str] = None) -> Trainer.Config:
    """torchtitan's trainer config as trnqwen's: the same values, trnqwen's trainer, checkpointer,
    metrics processor and validator classes, and ``hooks``.  The generated config module returns it,
    naming its ``backend`` (native, hf-v5, nki-moe: the metrics stream's header says it)."""
    from trnqwen.runtime.trainer_checkpoint import checkpoint_config
    from trnqwen.runtime.trainer_metrics import metrics_config

    cls = config if isinstance(config, type) else type(config)
    if getattr(cls, "_owner", None) is not None and issubclass(cls._owner, TrnqwenTrainerMixin):
        out = config
    else:
        out = same_values(_config_over(cls), config)
    out.hooks = [*getattr(out, "hooks", []), *hooks]
    out.checkpoint = checkpoint_config(out.checkpoint)
    out.metrics = metrics_config(out.metrics, backend=backend)
    out.validator = validator_config(out.validator)
    return out


# --- the validator ----------------------------------------------------------------------------


class TrnqwenValidator(TrainerAttached, Validator):
    """torchtitan's Validator; each batch goes past the trainer's hooks first (mode ``"val"``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        pass

    def post_dataloading_process(self, input_dict, labels, model_parts):
        for hook in self.hooks:
            hook.on_batch(self.trainer, input_dict, "val")
        return super().post_dataloading_process(input_dict, labels, model_parts)


def validator_config(base: Validator.Config) -> Validator.Config:
    """torchtitan's validator config as trnqwen's; another validator a base config chose is kept as it is."""
    return as_trnqwen_config(base, TrnqwenValidator.Config, titan_cls=Validator.Config)


# --- the config, adjusted before torchtitan builds from it -----------------------------------------


def prepare_config(config: Trainer.Config, device: Optional[str]) -> None:
    """What the parsed config (CLI overrides applied) needs before torchtitan builds from it:
    override imports in this torchtitan's form, the CPU attention override on a CPU."""
    from torchtitan.config.override import _REGISTRY

    from trnqwen import titan_compat as compat

    if hasattr(config, "hf_model"):  # the Transformers backend, on every device
        from trnqwen.runtime import hf_rope

        hf_rope.arm()
    imports = list(config.override.imports)
    if compat.detect().override_import_style == "function":
        imports = compat.expand_override_imports(imports, _REGISTRY)
    if device == "cpu":
        _adapt_for_cpu(config, imports)
    config.override.imports = imports


def _adapt_for_cpu(config: Trainer.Config, imports: list) -> None:
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


__all__ = ["TrnqwenTrainer", "TrainerHook", "TrnqwenValidator", "trnqwen_config", "trainer_over", "HOOK_ORDER", "configure"]
