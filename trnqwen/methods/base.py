"""What a training method declares: one frozen :class:`Method`, read by every generic reader.

A method is one folder under ``trnqwen/methods/`` whose ``__init__.py`` holds its ``METHOD``
(this declaration: stdlib only, so the registry and ``trnqwen --help`` stay instant).  Everything
heavier is named by a dotted path (``"package.module:attribute"``) and imported only by the
reader that needs it, with :func:`load`:

* ``settings``: a pydantic sub-model whose fields are the method's run settings (help, default,
  bounds; their names are the config keys, ``--flags`` and ``TRNQWEN_*`` variables);
* ``plan``: ``plan(cfg, assets_dir, rank_data, *, device_type, dp_degree, steps, validates)`` ->
  a :class:`MethodPlan` (or None): refusals raise ``UsageError``; the plan carries the
  config-module lines of the torchtitan backends and the hf-trainer hook settings;
* ``hf_trainer``: the class the hf-trainer ranks instantiate with the plan's settings
  (``runtime/hf_trainer.py`` loads it from the spec; runtime never imports ``methods/``);
* ``judge``: ``rules(facts: dict) -> [(severity, code, message, lines)]`` on plain data;
* ``log_lines``: the module of the method's own text lines (``[DPO] step: ...``) for
  ``inspect-logs``: ``READERS`` (a tuple of :class:`~trnqwen.contract.method_lines.LineReader`:
  what each line says), and on what was kept (``facts``, plain data, as for ``judge``)
  ``summary(facts) -> dict | None`` (``--json``'s key named after the method; None: not this
  method's run) and ``rows(facts) -> [(what, text)]`` (the table's rows);
* ``eval_report``: the module ``trnqwen eval`` scores this method's data with (``settings``, ``score``,
  ``numbers``, ``FIELDS``, ``SUMMARY_FIELDS``) and shows it by (``TABLE_COLUMNS``, ``table_note(settings)``);
  a method whose data has no answers to score (GRPO's prompts: the models answer them) also gives
  ``loss(scores) -> None``, ``completion_tokens(scores)``, ``answers(scores, n)`` and ``ANSWERS``
  (answers side by side), ``say(row)``, ``summary_line(base, tuned)``, ``table(rows, settings)`` and
  ``before_after(base, tuned)`` (the fine-tune's last line); without them, the preference report's;
* ``quickstart``: the module of the quickstart's stage for this method;
* ``prompts``: a method whose ``data`` is ``"prompts"`` (the model writes the answers: GRPO): the module
  that turns its records into the token cache the ranks read, ``prepare(cfg, assets_dir) ->
  PreparedData``, and previews them for ``trnqwen data``, ``preview(cfg, assets_dir) -> dict`` and
  ``print_preview(report)``;
* ``card``: the model card's section (``card(run_config: dict, eval: dict|None) -> str``);
* ``examples``: the lines of the commands' ``--help`` examples that show the method
  (:class:`Example`: ``trnqwen train ... --method dpo``), so ``cli/`` never names a method.

Metrics are named as in the metrics stream (``"dpo/margin"``, :mod:`trnqwen.contract.metrics_stream`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

DataKind = Literal["chat", "preference", "prompts"]


@dataclass(frozen=True)
class Metric:
    """One value a method logs each step (and validation), by its metrics-stream name."""

    name: str  # "dpo/margin": the metrics stream's key
    label: str  # "margin": what a table column / status line calls it
    fmt: str = ".4f"  # format spec of its value
    status: bool = False  # shown on the live status line after the loss
    panel: Optional[str] = None  # the plot panel it is drawn on (None: not plotted); one twin axis per "panel:right"
    help: str = ""


@dataclass(frozen=True)
class Example:
    """One example of a command's ``--help`` (``trnqwen <command> --help``) that shows a method."""

    command: str  # the command whose help shows it: "train", "data"
    line: str  # the command line: "trnqwen train --method dpo --dataset prefs.jsonl"
    what: str  # what it shows (a comment beside or above the line)


@dataclass(frozen=True)
class Method:
    name: str  # what --method takes
    help: str  # one line: what it trains on and what it optimises
    data: DataKind  # the records it reads: chat (SFT formats), preference (pairs) or prompts (the model answers)
    settings: Optional[str] = None  # "module:Model", a pydantic sub-model of RunConfig's fields
    metrics: tuple[Metric, ...] = ()
    # default peak learning rate and why, for a full fine-tune and for LoRA (None: the generic rule)
    lr: Optional[tuple[float, str]] = None
    lora_lr: Optional[tuple[float, str]] = None
    token_loss: bool = True  # its loss is the next-token loss (the judge's ln(vocab) check applies)
    plan: Optional[str] = None  # "module:function" -> MethodPlan | None
    hf_trainer: Optional[str] = None  # "module:Class": the hf-trainer ranks' hooks
    judge: Optional[str] = None  # "module:function": rules(facts) -> findings
    log_lines: Optional[str] = None  # module: READERS, summary(facts), rows(facts): its text lines in inspect-logs
    eval_report: Optional[str] = None  # module: settings / score / numbers / FIELDS / TABLE_COLUMNS / table_note
    quickstart: Optional[str] = None  # module: STAGE, settings(chat_settings, ranks), judge_run(info, device)
    card: Optional[str] = None  # "module:function": the model card's section
    prompts: Optional[str] = None  # module: prepare / preview / print_preview of a "prompts" method's data
    docs: str = ""  # the page that explains it
    examples: tuple[Example, ...] = ()  # its lines in the commands' --help examples


@dataclass
class MethodPlan:
    """A planned run of a method (what ``Method.plan`` returns): handed to the backends' renderers."""

    method: str
    settings: dict[str, Any] = field(default_factory=dict)  # plain values (JSON) the ranks' hooks get
    imports: list[str] = field(default_factory=list)  # torchtitan config module: import lines
    config_lines: list[str] = field(default_factory=list)  # torchtitan config module: config-function lines
    # torchtitan config module: expressions of its trainer hooks (trnqwen.runtime.trainer.TrainerHook),
    # passed to trnqwen_config(config, hooks=[...]); their classes are imported by ``imports``
    hooks: list[str] = field(default_factory=list)
    note: str = ""  # the plan's line for the user
    spec: Any = None  # the method's own planned form (e.g. its loss settings), for its own modules


def load(dotted: str) -> Any:
    """``"package.module:attribute"`` -> the attribute; ``"package.module"`` -> the module."""
    module, _, attr = dotted.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj
