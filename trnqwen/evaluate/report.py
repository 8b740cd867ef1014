"""The eval result: one table (checkpoint, tokens, loss, perplexity, change against base), the
answers side by side, and one JSON object with exactly the documented keys.

JSON: ``{"dataset", "results": [{"checkpoint", "tokens", "loss", "perplexity", "delta_vs_base"}],
"generations": [{"prompt", "conversation", "reference", "answers": {checkpoint: text}}]}``.  A perplexity too
large for a float is ``null`` (JSON has no infinity).

On preference pairs (the cache of a method that trains on them) the object also says
``"method"`` and the settings the method scored with; ``tokens``/``loss``/``perplexity`` are
those of the chosen answers, and each result adds ``pairs``, ``preference_accuracy``, ``margin``
and the method's own fields against the base as reference (``null`` for the base itself): the
method's ``eval_report`` module says which (``trnqwen/methods/<name>/eval_report.py``).

On held-out prompts (a GRPO run: the models answer them, the run's rewards score the answers)
``loss``/``perplexity`` are ``null`` (the prompts carry no answers of their own), ``tokens`` are
the tokens the model wrote, each result adds the method's fields (``prompts``, ``mean_reward``,
``pass_at_1``...) and ``generations`` hold a few prompts with each model's answer; the method's
``eval_report`` also gives the table and the summary line (its ``table``, ``summary_line``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from trnqwen.output import number

EVAL_RECORD = "eval.json"  # the run's own validation split, written into the run directory the tuned checkpoint came from


def other_data_record(name: str) -> str:
    """``eval-<data>-<hash6>.json``: where the results on other data (``--dataset``) go in the run dir,
    so they never pass for the run's held-out numbers (eval.json, the model card)."""
    import hashlib
    import re

    stem = re.sub(r"[^\w.-]+", "_", name.rstrip("/").split("/")[-1]).strip("._")[:40] or "data"
    return f"eval-{stem}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:6]}.json"


@dataclass
class EvalResult:
    checkpoint: str
    tokens: int
    loss: Optional[float]  # None: data with no answers of its own to score (held-out prompts)
    perplexity: Optional[float]
    delta_vs_base: Optional[float] = None
    preference: Optional[dict[str, Any]] = None  # preference pairs: the method's eval_report FIELDS

    def to_json(self) -> dict[str, Any]:
        out = {
            "checkpoint": self.checkpoint,
            "tokens": self.tokens,
            "loss": None if self.loss is None else round(self.loss, 6),
            "perplexity": round(self.perplexity, 4) if self.perplexity is not None and math.isfinite(self.perplexity) else None,
            "delta_vs_base": None if self.delta_vs_base is None else round(self.delta_vs_base, 6),
        }
        for name, value in (self.preference or {}).items():
            out[name] = round(value, 6) if isinstance(value, float) and math.isfinite(value) else value
        return out


EMPTY_ANSWER = "(empty)"  # how an answer with no text is shown (the JSON keeps "")


@dataclass
class Generation:
    prompt: str  # the last user message
    reference: str
    answers: dict[str, str] = field(default_factory=dict)
    # every turn the model was given before its answer ({"role", "content"}: system prompt, earlier turns,
    # the last user message), as the chat template rendered them in training
    conversation: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "conversation": [dict(t) for t in self.conversation], "reference": self.reference,
                "answers": dict(self.answers)}


@dataclass
class EvalReport:
    dataset: str
    results: list[EvalResult] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)
    method: Optional[str] = None  # a method's own data (preference pairs): the method that scored it
    method_settings: Optional[dict[str, Any]] = None  # ... and the settings it scored with (beta, loss)

    def to_json(self) -> dict[str, Any]:
        head: dict[str, Any] = {"dataset": self.dataset}
        if self.method is not None:
            head.update(method=self.method, **(self.method_settings or {}))
        return {
            **head,
            "results": [r.to_json() for r in self.results],
            "generations": [g.to_json() for g in self.generations],
        }

    @property
    def base(self) -> Optional[EvalResult]:
        return next((r for r in self.results if r.checkpoint == "base"), None)

    def summary_line(self) -> Optional[str]:
        """``validation loss 5.41 -> 3.02 (-2.39) on 1,234 tokens`` (preference pairs:
        :func:`preference_line`): base against the last tuned."""
        base = self.base
        tuned = [r for r in self.results if r is not base]
        if base is None or not tuned:
            return None
        last = tuned[-1]
        if self.method is not None:
            own = _scorer(self.method)
            if hasattr(own, "summary_line"):
                return own.summary_line(base.to_json(), last.to_json())
            return preference_line(base.to_json(), last.to_json())
        return (
            f"validation loss {base.loss:.4f} -> {last.loss:.4f} ({last.loss - base.loss:+.4f}, "
            f"perplexity {_ppl(base.perplexity)} -> {_ppl(last.perplexity)}) on {last.tokens:,} held-out tokens"
        )


def preference_line(base: dict[str, Any], tuned: dict[str, Any]) -> str:
    """The preference summary, from two JSON result rows: ``preference accuracy before 0.5000 -> after
    0.8000, margin ...; chosen-answer loss before ... -> after ...``."""
    def num(x: object, spec: str = ".4f") -> str:
        return number(x, spec, finite=True)

    line = (f"preference accuracy before {num(base.get('preference_accuracy'))} -> after "
            f"{num(tuned.get('preference_accuracy'))}, margin {num(base.get('margin'), '+.4f')} -> {num(tuned.get('margin'), '+.4f')}")
    if tuned.get("reward_accuracy") is not None:
        line += f" (reward accuracy {num(tuned['reward_accuracy'])}, reward margin {num(tuned['reward_margin'], '+.4f')})"
    return (f"{line}; chosen-answer loss before {num(base.get('loss'))} -> after {num(tuned.get('loss'))} "
            f"on {tuned.get('pairs', 0):,} held-out pairs")


def _scorer(method: str):
    """A method's ``eval_report`` module."""
    from trnqwen.methods import registry

    return registry.load(registry.get(method).eval_report)


def _ppl(value: float) -> str:
    return f"{value:,.2f}" if math.isfinite(value) else "inf"


def render(report: EvalReport) -> None:
    """The human output: the table on stdout, then each conversation with every model's answer."""
    from trnqwen import output

    if report.method is not None:
        _render_preference(report)
    else:
        _render_loss(report)
    for n, gen in enumerate(report.generations, 1):
        earlier = gen.conversation[:-1] if gen.conversation and gen.conversation[-1]["role"] == "user" else gen.conversation
        lines = [f"[bold]#{n}[/bold] [dim]{_escape(t['role'])}:[/dim] {_escape(t['content'])}" for t in earlier]
        lines += [f"[bold]#{n} prompt:[/bold] {_escape(gen.prompt)}", f"  [dim]reference:[/dim] {_escape(shown(gen.reference))}"]
        lines += [f"  [cyan]{_escape(label)}:[/cyan] {_escape(shown(text))}" for label, text in gen.answers.items()]
        output.console(stderr=False).print("\n".join(lines))


def _render_loss(report: EvalReport) -> None:
    from trnqwen import output

    rows = [
        (
            r.checkpoint,
            f"{r.tokens:,}",
            f"{r.loss:.4f}",
            _ppl(r.perplexity),
            "" if r.delta_vs_base is None else f"{r.delta_vs_base:+.4f}",
        )
        for r in report.results
    ]
    output.table(f"Held-out loss on {report.dataset}", ["checkpoint", "tokens", "loss", "perplexity", "vs base"], rows)


PREFERENCE_COLUMNS = ["checkpoint", "pairs", "pref. accuracy", "margin"]  # then the method's, then these:
PREFERENCE_TAIL = ["chosen loss", "vs base"]


def preference_row(r: dict[str, Any], columns: tuple = ()) -> list[str]:
    """One JSON result row in table order: :data:`PREFERENCE_COLUMNS`, the method's ``columns``
    ((header, field, format) of its ``eval_report.TABLE_COLUMNS``; empty where None), :data:`PREFERENCE_TAIL`."""
    delta = r.get("delta_vs_base")
    own = ["" if r.get(name) is None else number(r.get(name), spec, finite=True) for _header, name, spec in columns]
    return [
        str(r.get("checkpoint")), f"{r.get('pairs', 0):,}", number(r.get("preference_accuracy"), finite=True),
        number(r.get("margin"), "+.4f", finite=True), *own, number(r.get("loss"), finite=True), "" if delta is None else f"{delta:+.4f}",
    ]


def _render_preference(report: EvalReport) -> None:
    """The table of a method's own data: the title's note and the method's columns are what its
    ``eval_report`` declares (``table_note(settings)``, ``TABLE_COLUMNS``)."""
    from trnqwen import output

    scorer = _scorer(report.method)
    note = scorer.table_note(report.method_settings or {})
    if hasattr(scorer, "table"):  # a method whose table is its own (held-out prompts)
        what, headers, rows = scorer.table([r.to_json() for r in report.results], report.method_settings or {})
        output.table(f"{what[:1].upper()}{what[1:]} on {report.dataset}" + (f" ({note})" if note else ""), headers,
                     [tuple(row) for row in rows])
        return
    columns = tuple(scorer.TABLE_COLUMNS)
    output.table(f"Held-out preference pairs on {report.dataset}" + (f" ({note})" if note else ""),
                 [*PREFERENCE_COLUMNS, *(header for header, _name, _spec in columns), *PREFERENCE_TAIL],
                 [tuple(preference_row(r.to_json(), columns)) for r in report.results])


def shown(answer: str) -> str:
    """An answer as a person reads it: ``(empty)`` when the model said nothing."""
    return answer if answer.strip() else EMPTY_ANSWER


def _escape(text: str) -> str:
    from rich.markup import escape

    from trnqwen.errors import redact

    return escape(redact(text))
