"""The options of the run settings, made from :class:`trnqwen.config.RunConfig` itself.

A setting is declared once, as a RunConfig field (:func:`trnqwen.config.setting`: help, default,
env variable, flags, panel); :func:`setting_option` turns it into a typer option and
:func:`takes_settings` gives a command one option per setting, so a new field is a new flag with
no line here.  Flags default to ``None`` = "not given", so lower-precedence sources still apply.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Optional, Union, get_args, get_origin

import typer

# the options that need no RunConfig live in _base_options (a command that needs no config imports it alone)
from trnqwen.cli._base_options import ConfigFileOpt, JsonOpt, user_paths  # noqa: F401 (re-exported)
from trnqwen.config import BY_NAME, SETTINGS
from trnqwen.settings import Setting

SETTINGS_KWARG = "settings"  # the keyword a command decorated by takes_settings receives them in


def _option_type(s: Setting) -> Any:
    """What typer parses the flag as: the field's type, or ``str`` where pydantic does the rest
    (a Literal, ``N|epoch``)."""
    leaf = s.info.annotation
    args = [a for a in get_args(leaf) if a is not type(None)]
    if get_origin(leaf) is Union and len(args) == 1:
        leaf = args[0]
    if leaf in (bool, int, float, Path, str):
        return leaf
    if get_origin(leaf) is list:
        return list[str]
    if get_origin(leaf) is Union and set(get_args(leaf)) <= {int, float}:
        return float
    return str


def setting_option(s: Setting) -> Any:
    """``Annotated[Optional[T], typer.Option(...)]`` for one setting."""
    kind = _option_type(s)
    flags = list(s.long_flags)
    if kind is bool and "/" not in flags[0]:
        flags = [f"{flags[0]}/--no-{flags[0][2:]}", *flags[1:]]
    if s.meta.get("short"):
        flags.insert(1, s.meta["short"])
    extra: dict[str, Any] = {}
    if s.meta.get("metavar"):
        extra["metavar"] = s.meta["metavar"]
    if s.meta.get("min") is not None:
        extra["min"] = s.meta["min"]
    option = typer.Option(*flags, help=s.flag_help, show_default=False, rich_help_panel=s.panel, **extra)
    return Annotated[Optional[kind], option]


def option_for(name: str) -> Any:
    return setting_option(BY_NAME[name])


def takes_settings(
    command: Optional[Callable[..., Any]] = None, *, only: Optional[Iterable[str]] = None,
    rows: Iterable[Setting] = SETTINGS,
) -> Any:
    """Give ``command`` one option per run setting (those with a flag; ``only``: these names), after
    its arguments and before its own options; it receives the ones given as ``settings={name: value}``.

    typer reads a command's parameters from its signature, so the signature is generated here
    from the settings; the function itself is written with its own parameters only.
    """
    if command is None:
        return functools.partial(takes_settings, only=only, rows=rows)
    wanted = None if only is None else set(only)
    chosen = [s for s in rows if s.has_flag and (wanted is None or s.name in wanted)]
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != SETTINGS_KWARG]
    clash = {p.name for p in own} & {s.param for s in chosen}
    if clash:
        raise TypeError(f"{command.__name__}: parameters {sorted(clash)} are run settings already")
    arguments = [p for p in own if _is_argument(p)]
    options = [p for p in own if not _is_argument(p)]
    generated = [
        inspect.Parameter(s.param, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=setting_option(s))
        for s in chosen
    ]
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in (*arguments, *generated, *options)]

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        given_settings = {}
        for s in chosen:
            value = kwargs.pop(s.param, None)
            if value is not None and value != [] and value != ():
                given_settings[s.name] = value
        return command(**kwargs, **{SETTINGS_KWARG: given_settings})

    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # typer must see the generated signature, not the function's own
    return run


def _is_argument(param: inspect.Parameter) -> bool:
    return any(isinstance(m, typer.models.ArgumentInfo) for m in getattr(param.annotation, "__metadata__", ()))


def given(**flags: object) -> dict[str, object]:
    """Only the flags the user actually passed (None = not given)."""
    return {k: v for k, v in flags.items() if v is not None}


DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show what would happen; change nothing.")]

# the settings other commands share, by the names they import
ModelOpt = option_for("model")
AssetsOpt = option_for("assets_dir")
BackendOpt = option_for("backend")
DeviceOpt = option_for("device")
StepsOpt = option_for("steps")
SeqLenOpt = option_for("seq_len")
MethodOpt = option_for("method")
DatasetFormatOpt = option_for("dataset_format")
DatasetSplitOpt = option_for("dataset_split")
TrainOnInputsOpt = option_for("train_on_inputs")
PackingOpt = option_for("packing")
LongConversationsOpt = option_for("long_conversations")
ValSplitOpt = option_for("val_split")
SeedOpt = option_for("seed")
AnswerEndOpt = option_for("answer_end")
ValDatasetOpt = option_for("val_dataset")
DataCacheDirOpt = option_for("data_cache_dir")
