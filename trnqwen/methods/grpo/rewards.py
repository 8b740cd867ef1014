"""GRPO's rewards: the ``--reward`` list, the built-ins, your own functions, and one call that
scores a batch.

Public API (names are stable; the rank integration builds on them):

* :func:`parse_rewards` (``["accuracy", "format:0.5", "mypkg.rewards:f:2"]``) -> ``[RewardSpec]``.
  A value is ``NAME[:WEIGHT]``: a built-in name, or your function as ``package.module:function``,
  ``package.module.function`` (TRL's ``--reward_funcs`` form) or ``path/to/file.py:function``;
  a last ``:WEIGHT`` that reads as a number is the weight (default 1);
* :class:`BuiltinOptions`: what the built-ins need from the run (``max_completion_length``, the
  format regex, the length penalty's window, whether plain-text answers count);
* built-ins (:data:`BUILTINS`): ``accuracy`` (TRL's ``accuracy_reward``: math-verify parses the
  record's ``solution`` column, or ``answer``, and the completion's final answer, the text after
  the last ``</think>``, and verifies them as maths: ``\\boxed{}``, fractions, LaTeX; None when the
  gold answer cannot be parsed), ``format`` (1 if the completion matches a regex, by default
  Qwen3's reasoning then an answer: ``<think>...</think>`` then text), ``length`` (DAPO's soft
  overlong penalty: 0 up to ``max_completion_length - window`` tokens, then down linearly to -1);
* :class:`RewardSet` (``RewardSet.build(specs, options)``): calls every function with TRL's
  signature ``f(prompts=..., completions=..., completion_ids=..., **columns, trainer_state=...,
  log_extra=..., log_metric=...) -> list[float | None]`` and returns :class:`RewardScores`
  (per function ``[N, F]``, NaN for None; the weighted NaN-sum; what the functions logged);
* :meth:`RewardSet.pass_thresholds`: which functions tell a right answer (a ``pass_threshold``
  attribute on the function: ``accuracy`` 1.0), for ``trnqwen eval``'s pass@1;
* :func:`total_reward`: the weighted NaN-sum again (after the caller gathers ``per_func`` from
  every rank), NaN where no function scored;
* :func:`as_completions`: decoded texts in the shape TRL hands reward functions (a message list
  per completion when the prompts are conversations, plain strings otherwise);
* :class:`RewardError` (a ``UsageError``, exit 2): a function could not be imported, raised,
  returned the wrong number of rewards or something that is not a number; the message names
  the function (and its ``--reward`` value) and the record.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from trnqwen.errors import UsageError

BUILTINS = ("accuracy", "format", "length")
# Qwen3's reasoning layout: reasoning closed by </think> (the opening <think> optional: thinking
# templates write it into the prompt), then an answer; no other think tag anywhere
DEFAULT_FORMAT = r"^\s*(?:<think>)?(?:(?!</?think>).)*</think>\s*(?!</?think>)\S(?:(?!</?think>).)*\Z"
ANSWER_COLUMNS = ("solution", "answer")  # TRL's accuracy_reward reads "solution"
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # what TRL does not pass on as columns


class RewardError(UsageError):
    """A reward function failed: named with the record it failed on (exit 2)."""


@dataclass(frozen=True)
class RewardSpec:
    target: str  # a built-in name, "module:function", "module.function" or "file.py:function"
    weight: float = 1.0
    text: str = ""  # the --reward value as given

    @property
    def builtin(self) -> bool:
        return self.target in BUILTINS


def parse_rewards(values: Sequence[str]) -> list[RewardSpec]:
    """The ``--reward`` values as specs (module doc); a bad one is a ``UsageError``."""
    specs = []
    for raw in values:
        text = str(raw).strip()
        target, weight = text, 1.0
        head, sep, tail = text.rpartition(":")
        if sep and _is_number(tail):
            target, weight = head, float(tail)
            if not math.isfinite(weight):
                raise UsageError(f"--reward {text}: the weight must be a finite number")
        if not target:
            raise UsageError(f"--reward {text!r}: no reward named", hint=_HINT)
        if ":" not in target and "." not in target and target not in BUILTINS:
            raise UsageError(f"--reward {text}: unknown built-in reward {target!r}", hint=_HINT)
        specs.append(RewardSpec(target, weight, text))
    if not specs:
        raise UsageError("no reward given", hint=_HINT)
    return specs


_HINT = (f"built-ins: {', '.join(BUILTINS)}; your own function as package.module:function (TRL's reward "
         "signature), optionally :WEIGHT, e.g. --reward accuracy --reward mypkg.rewards:brevity:0.5")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --- the built-ins -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinOptions:
    max_completion_length: int = 512
    format_pattern: str = DEFAULT_FORMAT  # re.match with DOTALL | MULTILINE (TRL's flags)
    length_window: Optional[int] = None  # the length penalty's window (default: a fifth of the maximum)
    plain_answers: bool = False  # accuracy: also a plain number/expression counts, not only \boxed{}/LaTeX


def content(completion: Union[str, list, dict]) -> str:
    """A completion's text: the string itself, or the content of its (first) assistant message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[0], dict):
        return str(completion[0].get("content") or "")
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return str(completion)


def final_answer(text: str) -> str:
    """What follows the last ``</think>`` (the whole text when there is none)."""
    return text.rsplit("</think>", 1)[-1]


def accuracy_reward(options: BuiltinOptions) -> Callable:
    def accuracy(completions, **columns) -> list[Optional[float]]:
        column = next((c for c in ANSWER_COLUMNS if c in columns), None)
        if column is None:
            raise KeyError(f"the records have no {' or '.join(repr(c) for c in ANSWER_COLUMNS)} column to check "
                           f"answers against (columns: {', '.join(sorted(columns)) or 'none'})")
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        extraction = [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True),
                                            boxed_match_priority=0, try_extract_without_anchor=False)]
        if options.plain_answers:
            extraction.append(ExprExtractionConfig())
        rewards: list[Optional[float]] = []
        for completion, gold in zip(completions, columns[column]):
            gold_parsed = parse(str(gold))
            if not gold_parsed:
                rewards.append(None)  # an answer that is not maths: this reward does not apply
                continue
            answer = parse(final_answer(content(completion)), extraction_config=extraction,
                           extraction_mode="first_match")
            rewards.append(float(verify(gold_parsed, answer)))
        return rewards

    accuracy.pass_threshold = 1.0  # a verified answer: eval's pass@1 counts it (RewardSet.pass_thresholds)
    return accuracy


def format_reward(options: BuiltinOptions) -> Callable:
    pattern = re.compile(options.format_pattern, re.DOTALL | re.MULTILINE)

    def format(completions, **columns) -> list[float]:
        return [1.0 if pattern.match(content(c)) else 0.0 for c in completions]

    return format


def length_reward(options: BuiltinOptions) -> Callable:
    top = options.max_completion_length
    window = options.length_window if options.length_window is not None else max(1, top // 5)
    start = top - window

    def length(completion_ids, **columns) -> list[float]:
        out = []
        for ids in completion_ids:
            n = len(ids)
            out.append(0.0 if n <= start else (-1.0 if n > top else (start - n) / window))
        return out

    return length


_FACTORIES = {"accuracy": accuracy_reward, "format": format_reward, "length": length_reward}


# --- your own functions --------------------------------------------------------------------------


def load_function(spec: RewardSpec) -> Callable:
    """The callable a non-built-in spec names; a ``RewardError`` naming it if it cannot be had."""
    target = spec.target
    module_name, sep, attr = target.rpartition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise RewardError(f"--reward {spec.text}: name a function as package.module:function", hint=_HINT)
    try:
        if module_name.endswith(".py") or "/" in module_name:
            module = _module_from_file(Path(module_name).expanduser())
        else:
            module = importlib.import_module(module_name)
    except RewardError:
        raise
    except Exception as exc:  # ImportError, or anything the module raises while it loads
        raise RewardError(f"--reward {spec.text}: cannot import {module_name} ({type(exc).__name__}: {exc})",
                          hint="check the module is importable from this environment (PYTHONPATH) "
                               "or give the file's path: path/to/file.py:function") from None
    func = getattr(module, attr, None)
    if func is None or not callable(func):
        raise RewardError(f"--reward {spec.text}: {module_name} has no function {attr!r}",
                          hint="name a function defined in that module")
    return func


def _module_from_file(path: Path) -> types.ModuleType:
    if not path.is_file():
        raise RewardError(f"reward module {path} does not exist", hint="give the path of a Python file")
    name = f"trnqwen_reward_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# --- scoring a batch -----------------------------------------------------------------------------


@dataclass
class RewardScores:
    names: list[str]
    per_func: Any  # torch.Tensor [N, F] float32, NaN where a function returned None
    total: Any  # torch.Tensor [N]: the weighted NaN-sum, NaN where no function scored
    extra: dict[str, list] = field(default_factory=dict)  # columns the functions logged (log_extra)
    metrics: dict[str, list[float]] = field(default_factory=dict)  # values they logged (log_metric)

    def means(self) -> dict[str, float]:
        """Each function's mean over the completions it scored (TRL's ``rewards/<name>/mean``)."""
        import torch

        return {name: float(torch.nanmean(self.per_func[:, i])) for i, name in enumerate(self.names)}


def total_reward(per_func, weights):
    """``[N]`` weighted NaN-sum of ``per_func`` ``[N, F]``; NaN where every function said None."""
    import torch

    total = (per_func * torch.as_tensor(weights, dtype=per_func.dtype).unsqueeze(0)).nansum(dim=1)
    return torch.where(torch.isnan(per_func).all(dim=1), torch.full_like(total, float("nan")), total)


def as_completions(texts: Sequence[str], conversational: bool) -> list:
    """Decoded completions as TRL hands them to reward functions."""
    if conversational:
        return [[{"role": "assistant", "content": t}] for t in texts]
    return list(texts)


@dataclass
class RewardSet:
    specs: list[RewardSpec]
    functions: list[Callable]
    names: list[str]

    @classmethod
    def build(cls, specs: Sequence[RewardSpec], options: BuiltinOptions) -> "RewardSet":
        functions = [_FACTORIES[s.target](options) if s.builtin else load_function(s) for s in specs]
        names: list[str] = []
        for spec, func in zip(specs, functions):
            base = spec.target if spec.builtin else getattr(func, "__name__", None) or spec.target
            name, n = base, 2
            while name in names:
                name, n = f"{base}_{n}", n + 1
            names.append(name)
        return cls(list(specs), functions, names)

    @property
    def weights(self) -> list[float]:
        return [s.weight for s in self.specs]

    def pass_thresholds(self) -> list[Optional[float]]:
        """Per function, the value at or above which a completion is right (its ``pass_threshold``
        attribute: the built-in ``accuracy`` and the bundled task's reward have 1.0), None for a
        function that says nothing about right and wrong: what ``trnqwen eval``'s pass@1 counts."""
        out = []
        for func in self.functions:
            value = getattr(func, "pass_threshold", None)
            out.append(float(value) if isinstance(value, numbers.Real) else None)
        return out

    def score(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
              columns: dict[str, Sequence[Any]], records: Sequence[str], *,
              trainer_state: Optional[object] = None) -> RewardScores:
        """Every function on the batch (N completions; ``columns``: the records' other fields, one
        value per completion; ``records``: where each completion's record comes from, for errors)."""
        import torch

        n = len(completions)
        if not (len(prompts) == len(completion_ids) == len(records) == n):
            raise ValueError("prompts, completions, completion_ids and records must have one entry per completion")
        kwargs = {k: list(v) for k, v in columns.items() if k not in _NOT_COLUMNS}
        extra: dict[str, list] = {}
        metrics: dict[str, list[float]] = {}
        kwargs["trainer_state"] = trainer_state if trainer_state is not None else types.SimpleNamespace(global_step=0)
        kwargs["log_extra"] = lambda column, values: extra.setdefault(column, []).extend(values)
        kwargs["log_metric"] = lambda name, value: metrics.setdefault(name, []).append(float(value))
        per_func = torch.full((n, len(self.functions)), float("nan"), dtype=torch.float32)
        for f, (spec, func, name) in enumerate(zip(self.specs, self.functions, self.names)):
            args = dict(prompts=list(prompts), completions=list(completions), completion_ids=[list(c) for c in completion_ids])
            try:
                values = func(**args, **kwargs)
            except Exception as exc:
                raise self._failure(spec, name, func, exc, args, kwargs, records) from None
            per_func[:, f] = torch.tensor(self._checked(spec, name, values, records), dtype=torch.float32)
        return RewardScores(list(self.names), per_func, total_reward(per_func, self.weights), extra, metrics)

    def _label(self, spec: RewardSpec, name: str) -> str:
        return f"reward function {name!r}" + ("" if spec.text in ("", name) else f" (--reward {spec.text})")

    def _checked(self, spec: RewardSpec, name: str, values: object, records: Sequence[str]) -> list[float]:
        """``values`` (whatever the user's function returned) as floats, NaN for None."""
        n = len(records)
        try:
            values = list(values)
        except TypeError:
            raise RewardError(f"{self._label(spec, name)} returned {type(values).__name__}, not a list of "
                              f"{n} rewards (records {records[0]} ...)", hint=_SIGNATURE) from None
        if len(values) != n:
            raise RewardError(f"{self._label(spec, name)} returned {len(values)} rewards for {n} completions "
                              f"(records {records[0]} ...)", hint=_SIGNATURE)
        out = []
        for i, value in enumerate(values):
            if value is None:
                out.append(math.nan)
                continue
            if isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
                number = float(value)
                if not math.isinf(number):
                    out.append(number)
                    continue
            raise RewardError(f"{self._label(spec, name)} returned {value!r} for {records[i]} (completion {i + 1} of "
                              f"{n}), not a number", hint=_SIGNATURE)
        return out

    def _failure(self, spec, name, func, exc, args, kwargs, records) -> RewardError:
        """The error for a function that raised, naming the first record that makes it raise alone
        (each completion tried by itself), or the batch when none does."""
        where = f"on the batch of {len(records)} completions (records {records[0]} ...)"
        for i in range(len(records)):
            one = {k: [v[i]] for k, v in args.items()}
            one.update({k: ([v[i]] if isinstance(v, list) else v) for k, v in kwargs.items()})
            try:
                func(**one)
            except Exception:
                where = f"on {records[i]} (completion {i + 1} of {len(records)})"
                break
        detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc) else type(exc).__name__
        return RewardError(f"{self._label(spec, name)} raised {detail} {where}",
                           hint="fix the function or the record; a reward function must return one float (or None) "
                                "per completion")


_SIGNATURE = ("a reward function is f(prompts, completions, completion_ids, **columns) -> list of one float "
              "(or None: does not apply) per completion, TRL's signature")
