"""The one list of training methods: ``--method`` takes these names, and every generic reader
(config, data cache, model card, eval, quickstart, judge, the hf-trainer ranks) asks here.

A new method is a folder ``trnqwen/methods/<name>/`` with its :class:`~trnqwen.methods.base.Method`
in ``__init__.py``, and one line below.  Light: stdlib and the declarations only (``trnqwen
--help`` never imports torch, pydantic or the methods' heavy modules).
"""

from __future__ import annotations

from typing import Iterator, Optional

from trnqwen.methods import dpo, grpo, orpo, sft
from trnqwen.methods.base import Example, Method, load

_METHODS: dict[str, Method] = {m.name: m for m in (
    sft.METHOD,
    dpo.METHOD,
    orpo.METHOD,
    grpo.METHOD,
)}
DEFAULT = "sft"
NAMES: tuple[str, ...] = tuple(_METHODS)  # the built-in methods (what RunConfig.method accepts)


def get(name: Optional[str]) -> Method:
    """The method called ``name`` (None: the default); KeyError naming the known ones."""
    try:
        return _METHODS[name or DEFAULT]
    except KeyError:
        raise KeyError(f"unknown training method {name!r}: one of {', '.join(_METHODS)}") from None


def find(name: Optional[str]) -> Optional[Method]:
    return _METHODS.get(name or DEFAULT)


def methods() -> Iterator[Method]:
    yield from _METHODS.values()


def of(cfg: object) -> Method:
    """The method of a config (a RunConfig, a run record's dict, or anything with ``method``)."""
    name = cfg.get("method") if isinstance(cfg, dict) else getattr(cfg, "method", None)
    return get(name)


def names_for_data(kind: str) -> tuple[str, ...]:
    """The names of the methods that train on ``kind`` records (``chat`` or ``preference``): what a
    data hint offers (``--method X``)."""
    return tuple(m.name for m in _METHODS.values() if m.data == kind)


def examples(command: str) -> list[Example]:
    """Every method's examples for ``trnqwen <command> --help``, in the registry's order."""
    return [e for m in _METHODS.values() for e in m.examples if e.command == command]


def register(method: Method) -> None:
    """Add a method (tests; a plug-in).  The built-in list above is where a shipped method goes."""
    _METHODS[method.name] = method


def unregister(name: str) -> None:
    _METHODS.pop(name, None)


def help_text() -> str:
    """``method``'s help: ``sft (...) or dpo (...).``, each method's name and its one line."""
    parts = [f"{m.name} ({m.help})" for m in _METHODS.values()]
    return (", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]) + "."


def settings_models() -> list[type]:
    """The pydantic sub-models of the methods' settings (imports pydantic: config.py's business)."""
    return [load(m.settings) for m in _METHODS.values() if m.settings]


def hook(method: Method, what: str):
    """Load one of ``method``'s dotted entry points (``plan``, ``judge``, ``card``...), None when it has none."""
    dotted = getattr(method, what)
    return load(dotted) if dotted else None
