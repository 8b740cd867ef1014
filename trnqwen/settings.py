"""A setting declared once: a pydantic field with the metadata every reader of it takes.

:func:`setting` is pydantic's ``Field`` plus the CLI's side of the field (flags, env variable,
shown default, panel); :func:`settings` lists a model's leaf fields, sub-models' fields included
(``sub.field``), as :class:`Setting` rows.  :mod:`trnqwen.config` declares RunConfig with it; the
CLI (``cli/_options.py``), ``config show``, docs/config.md (``cli/docgen.py``) and the TOML and
environment readers all read the rows, so a new field needs no other line.  No typer here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union, get_args, get_origin

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ENV_PREFIX = "TRNQWEN_"
CLI_KEY = "trnqwen"  # the json_schema_extra key holding a field's CLI metadata


def setting(
    default: Any = PydanticUndefined,
    *,
    help: str,
    panel: Optional[str] = None,
    flags: Optional[tuple[str, ...]] = None,
    short: Optional[str] = None,
    flag: bool = True,
    env: Optional[str] = None,
    env_note: Optional[str] = None,
    shown_default: Optional[str] = None,
    metavar: Optional[str] = None,
    min: Optional[int] = None,
    former: tuple[str, ...] = (),
    **field_kwargs: Any,
) -> Any:
    """A config field declared once: pydantic's ``Field`` with the metadata the CLI, the env
    reader and the docs take from it (see :class:`Setting`).

    ``help`` is the field's description and the flag's help text; ``flags`` the long flags
    (default ``--<name-with-dashes>``, a bool also gets ``--no-<name>``); ``short`` a short flag;
    ``flag=False``: no flag (file/env only); ``env`` the variable (default ``TRNQWEN_<PATH>``,
    a sub-model's fields joined by ``__``); ``shown_default`` the ``[default: ...]`` text where the
    value alone does not say it; ``min`` a typer range shown on the flag; ``former`` the names a
    field had before it moved (old trnqwen.toml keys and run.json records still load).
    """
    meta: dict[str, Any] = {"panel": panel, "flags": list(flags) if flags else None, "short": short, "flag": flag,
                            "env": env, "env_note": env_note, "shown_default": shown_default, "metavar": metavar,
                            "min": min, "former": list(former) or None}
    extra = {CLI_KEY: {k: v for k, v in meta.items() if v is not None}}
    return Field(default, description=help, json_schema_extra=extra, **field_kwargs)


@dataclass(frozen=True)
class Setting:
    """One leaf field of the config as the outside sees it.  ``path`` is the attribute path:
    ``("steps",)``, or ``("sub", "field")`` for a field of a sub-model; ``name`` joins it with dots
    (the key in ``config show``, in sources and in a TOML ``[sub]`` table or dotted key)."""

    path: tuple[str, ...]
    info: FieldInfo

    @property
    def meta(self) -> dict[str, Any]:
        extra = self.info.json_schema_extra
        return dict(extra.get(CLI_KEY) or {}) if isinstance(extra, dict) else {}

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def param(self) -> str:
        """The keyword of the CLI function (a Python identifier): ``steps``, ``sub__field``."""
        return "__".join(self.path)

    @property
    def help(self) -> str:
        return self.info.description or ""

    @property
    def panel(self) -> Optional[str]:
        return self.meta.get("panel")

    @property
    def env(self) -> str:
        return self.meta.get("env") or ENV_PREFIX + "__".join(self.path).upper()

    @property
    def has_flag(self) -> bool:
        return bool(self.meta.get("flag", True))

    @property
    def long_flags(self) -> tuple[str, ...]:
        given = self.meta.get("flags")
        if given:
            return tuple(given)
        return ("--" + "-".join(self.path).replace("_", "-"),)

    @property
    def flag(self) -> str:
        """The flag a source line names (``flag --assets``)."""
        return self.long_flags[0]

    @property
    def shown_default(self) -> Optional[str]:
        """The ``[default: ...]`` text of the flag's help, or None where nothing is shown."""
        if "shown_default" in self.meta:
            return self.meta["shown_default"]
        value = self.default
        if value is None or value == []:
            return None
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float):
            mantissa, exponent = f"{value:e}".split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return str(value)

    @property
    def default(self) -> Any:
        if self.info.default_factory is not None:
            return self.info.default_factory()
        return None if self.info.default is PydanticUndefined else self.info.default

    @property
    def flag_help(self) -> str:
        """The flag's help: the description, where the env variable sets it, its default."""
        note = f" ({self.meta['env_note']})" if self.meta.get("env_note") else ""
        text = f"{self.help} Env: {self.env}{note}."
        shown = self.shown_default
        return f"{text} [default: {shown}]" if shown is not None else text

    @property
    def former(self) -> tuple[str, ...]:
        return tuple(self.meta.get("former") or ())

    @property
    def is_path(self) -> bool:
        return "Path" in str(self.info.annotation)


def _leaf_type(annotation: Any) -> Any:
    """``Optional[X]`` -> X; anything else as it is."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Union and len(args) == 1:
        return args[0]
    return annotation


def _sub_model(annotation: Any) -> Optional[type[BaseModel]]:
    leaf = _leaf_type(annotation)
    return leaf if isinstance(leaf, type) and issubclass(leaf, BaseModel) else None


def settings(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> tuple[Setting, ...]:
    """Every leaf setting of ``model``, sub-models' fields included, in declaration order."""
    out: list[Setting] = []
    for name, info in model.model_fields.items():
        sub = _sub_model(info.annotation)
        if sub is not None:
            out.extend(settings(sub, (*prefix, name)))
        else:
            out.append(Setting((*prefix, name), info))
    return tuple(out)


def value_of(config: BaseModel, name: str) -> Any:
    """The value of setting ``name`` (``sub.field``: a sub-model's field) in ``config``."""
    value: Any = config
    for part in name.split("."):
        value = getattr(value, part)
    return value


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"sub.field": 0.2, "steps": 3}`` -> ``{"sub": {"field": 0.2}, "steps": 3}`` (what pydantic takes)."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def flatten_settings(values: dict[str, Any], by_name: dict[str, Setting], former: dict[str, str],
                     prefix: str = "") -> dict[str, Any]:
    """The inverse of :func:`nest` for a dumped model: a sub-model's dict becomes dotted names.
    A key naming a setting's former place (``former``: a run.json or trnqwen.toml from before a
    field moved into a sub-model) is read as the setting's name now."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and any(s.startswith(name + ".") for s in by_name):
            out.update(flatten_settings(value, by_name, former, name + "."))
        else:
            out[former.get(name, name)] = value
    return out
