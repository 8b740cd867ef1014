"""The data settings beyond one file in a standard shape, declared once (:func:`trnqwen.settings.setting`).

:class:`trnqwen.config.RunConfig` takes every field here as a flat field (its flag, ``TRNQWEN_*``
variable, trnqwen.toml key and docs/config.md row follow), as it takes the methods' settings:

* the **mapping** of one dataset's columns, message keys and role names onto trnqwen's formats
  (:class:`DataMapping`, axolotl's key names: ``field_messages``, ``message_property_mappings``,
  ``roles``...; applied by :mod:`trnqwen.dataset.mapping`);
* ``datasets``: several datasets mixed by weight or record count, each a ``[[datasets]]`` table
  in trnqwen.toml with its own path, format and mapping (:class:`DatasetEntry`; mixed by
  :mod:`trnqwen.dataset.mixture`);
* how rows are packed (``packing_strategy``: best-fit or sequential, :mod:`trnqwen.dataset.bestfit`);
* the chat template (``chat_template``: a file or a built-in name; ``enable_thinking``;
  :mod:`trnqwen.dataset.template`).

pydantic and the settings core only: trnqwen.config imports it, and ``trnqwen --help`` stays instant.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from trnqwen.settings import setting

MAPPING_PANEL = "Data mapping"
ROLE_NAMES = ("system", "user", "assistant", "tool")
PACKING_STRATEGIES = ("best-fit", "sequential")
# field_<name> -> the field a standard record has there (formats.py, preference_formats.py)
FIELD_TARGETS = {
    "field_messages": "messages", "field_system": "system", "field_instruction": "instruction", "field_input": "input",
    "field_output": "output", "field_prompt": "prompt", "field_completion": "completion", "field_chosen": "chosen",
    "field_rejected": "rejected",
}
MESSAGE_PROPERTIES = ("role", "content")


def _split_list(value: object) -> object:
    """``"a,b"`` (a flag, a variable) -> ``["a", "b"]``; a list (TOML) as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _pairs(value: object) -> object:
    """``"role=from,content=value"`` -> ``{"role": "from", "content": "value"}``; a table as it is."""
    if not isinstance(value, str):
        return value
    out: dict[str, str] = {}
    for part in _split_list(value):
        name, eq, key = part.partition("=")
        if not eq or not name.strip() or not key.strip():
            raise ValueError(f"{part!r} is not NAME=KEY (write role=from,content=value)")
        out[name.strip()] = key.strip()
    return out


def _properties(value: object) -> object:
    value = _pairs(value)
    if isinstance(value, dict):
        unknown = [name for name in value if name not in MESSAGE_PROPERTIES]
        if unknown:
            raise ValueError(f"unknown message property {unknown[0]!r}: map {' and '.join(MESSAGE_PROPERTIES)} "
                             "(role=from,content=value)")
    return value


def _roles(value: object) -> object:
    """``"user=human,assistant=gpt,assistant=bot"`` -> ``{"user": ["human"], "assistant": ["gpt", "bot"]}``;
    a table's single names become lists; each target must be a role trnqwen knows."""
    if isinstance(value, str):
        out: dict[str, list[str]] = {}
        for part in _split_list(value):
            role, eq, name = part.partition("=")
            if not eq or not role.strip() or not name.strip():
                raise ValueError(f"{part!r} is not ROLE=NAME (write user=human,assistant=gpt)")
            out.setdefault(role.strip(), []).append(name.strip())
        value = out
    if isinstance(value, dict):
        value = {role: [names] if isinstance(names, str) else names for role, names in value.items()}
        unknown = [role for role in value if role not in ROLE_NAMES]
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r}: map names onto {', '.join(ROLE_NAMES)} "
                             "(user=human,assistant=gpt)")
    return value


Names = Annotated[list[str], BeforeValidator(_split_list)]
Properties = Annotated[dict[str, str], BeforeValidator(_properties)]
Roles = Annotated[dict[str, list[str]], BeforeValidator(_roles)]
PackingStrategy = Literal["best-fit", "sequential"]


def _column(what: str) -> Any:
    return setting(None, help=f"Column holding {what}.", metavar="COLUMN", panel=MAPPING_PANEL)


class DataMapping(BaseModel):
    """How one dataset's columns, message keys and role names map onto trnqwen's formats
    (axolotl's key names, so its users' dataset entries carry over)."""

    model_config = ConfigDict(extra="forbid")

    field_messages: Optional[str] = setting(
        None, help="Column holding the conversation (a list of messages), e.g. conversations.", metavar="COLUMN",
        panel=MAPPING_PANEL,
    )
    message_property_mappings: Optional[Properties] = setting(
        None, help="Keys of each message: role=from,content=value.", metavar="role=KEY,content=KEY",
        shown_default="role=role,content=content", panel=MAPPING_PANEL,
    )
    roles: Optional[Roles] = setting(
        None, help="Role names in the data -> system/user/assistant/tool: user=human,assistant=gpt "
        "(a role repeated for several names).", metavar="ROLE=NAME,...", panel=MAPPING_PANEL,
    )
    field_system: Optional[str] = _column("the system prompt")
    field_instruction: Optional[str] = _column("the instruction (Alpaca)")
    field_input: Optional[str] = _column("the instruction's input (Alpaca)")
    field_output: Optional[str] = _column("the answer (Alpaca)")
    field_prompt: Optional[str] = _column("the prompt (prompt/completion, preference pairs)")
    field_completion: Optional[str] = _column("the completion (prompt/completion)")
    field_chosen: Optional[str] = _column("the chosen answer (preference pairs)")
    field_rejected: Optional[str] = _column("the rejected answer (preference pairs)")
    remove_columns: Optional[Names] = setting(
        None, help="Columns dropped from every record before it is read (comma-separated).", metavar="COLUMN,...",
        panel=MAPPING_PANEL,
    )


MAPPING_KEYS: tuple[str, ...] = tuple(DataMapping.model_fields)


class DatasetEntry(DataMapping):
    """One ``[[datasets]]`` table: a dataset of a mixture, with its own format and mapping."""

    path: str = Field(description="A local file or folder, or a Hub dataset name.")
    weight: Optional[float] = Field(None, gt=0, allow_inf_nan=False,
                                    description="Its share of the trained tokens, relative to the others' weights.")
    records: Optional[int] = Field(None, ge=1, description="Exactly this many records (repeated when it has fewer).")
    type: Optional[str] = Field(None, description="Its record format (auto when unset); axolotl's chat_template "
                                "means messages.")
    split: Optional[str] = Field(None, description="Its Hub split (default: --dataset-split).")
    val_split: Optional[Union[float, str]] = Field(
        None, description="Its validation records: a fraction held out (0.05) or another split of the Hub dataset.",
    )

    @model_validator(mode="after")
    def _one_size(self) -> "DatasetEntry":
        if self.weight is not None and self.records is not None:
            raise ValueError(f"{self.path}: give weight or records, not both")
        if isinstance(self.val_split, float) and not 0.0 <= self.val_split < 1.0:
            raise ValueError(f"{self.path}: val_split must be a fraction in [0, 1) or a split name")
        return self


def _entries(value: object) -> object:
    """``TRNQWEN_DATASETS`` holds JSON (a list of tables); a TOML array of tables as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg}): write a list of tables, or use [[datasets]] in trnqwen.toml") from None
    return value


class DataChoices(BaseModel):
    """The data settings beside the mapping: several datasets, packing, the chat template."""

    datasets: Annotated[list[DatasetEntry], BeforeValidator(_entries)] = setting(
        default_factory=list, flag=False, panel="Data", env_note="a JSON list of tables",
        help="Several datasets mixed: [[datasets]] tables in trnqwen.toml, each with path, weight or records, type, "
        "split, val_split and its own mapping keys (docs/data.md).",
    )
    packing_strategy: PackingStrategy = setting(
        "best-fit", help="How conversations fill the rows: best-fit (longest first, into the fullest row that has "
        "room; rows in a seeded order) or sequential (file order, a new row when the next does not fit).", panel="Data",
    )
    chat_template: Optional[str] = setting(
        None, help="Chat template for the data, training, eval and the export: a .jinja file or a built-in name "
        "(chatml, chatml-think).", metavar="FILE|NAME", shown_default="the model's own", panel="Data",
    )
    enable_thinking: Optional[bool] = setting(
        None, help="enable_thinking for the chat template (Qwen3's hybrid thinking models).",
        shown_default="the template's default", panel="Data",
    )


def flat_fields() -> dict[str, tuple[Any, Any]]:
    """Every field here as (type, FieldInfo), for RunConfig's flat fields (trnqwen.config)."""
    return {name: (info.annotation, info) for model in (DataChoices, DataMapping) for name, info in model.model_fields.items()}
