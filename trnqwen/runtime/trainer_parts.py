"""What trnqwen's torchtitan component subclasses share (checkpointer, metrics processor,
validator: :mod:`trnqwen.runtime.trainer_checkpoint`, :mod:`trnqwen.runtime.trainer_metrics`,
:mod:`trnqwen.runtime.trainer`): torchtitan's config of a component turned into trnqwen's, and the
trainer with its hooks attached once torchtitan has built them all."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, Optional, TypeVar

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer

_C = TypeVar("_C")


def same_values(cls: type[_C], base: object) -> _C:
    """``cls`` (a subclass of ``base``'s config class) with every value of ``base``."""
    return cls(**{f.name: getattr(base, f.name) for f in fields(base) if f.init})


def as_trnqwen_config(base: _C, cls: type[_C], *, titan_cls: type, where: Optional[str] = None) -> _C:
    """torchtitan's ``titan_cls`` config ``base`` as trnqwen's ``cls`` (the same values); kept when
    already one.  Another subclass a base config chose is kept as it is, or, with ``where`` (the
    config's field: only torchtitan's own class can be extended there), refused."""
    if isinstance(base, cls):
        return base
    if type(base) is not titan_cls:
        if where is None:
            return base
        raise TypeError(f"config.{where} is a {type(base).__name__}; trnqwen's extends torchtitan's "
                        f"{titan_cls.__qualname__} only")
    return same_values(cls, base)


class TrainerAttached:
    """A component the trainer attaches itself and its hooks to (after torchtitan built both)."""

    trainer: Any = None  # trnqwen's trainer (a torchtitan Trainer subclass)
    hooks: tuple = ()  # its TrainerHooks, in the run's order

    def attach(self, trainer: Trainer, hooks: list) -> None:
        self.trainer, self.hooks = trainer, tuple(hooks)
