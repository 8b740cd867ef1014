"""Turn a parsed + judged run into a summary, the ``--json`` object, a rich table, CSV, and a
side-by-side comparison of two runs."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Optional

import numpy as np

from trnqwen.adapters.lora.readers import lora_json, lora_row
from trnqwen.logs.judge import (BASE_RANDOM_INIT, WEIGHTS_NOT_LOADED, Finding, configured_steps, layers_text, method_facts,
                                override_calls, override_table, root_cause)
from trnqwen.methods import registry as methods
from trnqwen.logs.patterns import no_peak_flops
from trnqwen.logs.record import ParsedLog
from trnqwen.contract.override_calls import override_label
from trnqwen.contract.stepline import STEP_FIELDS
from trnqwen.logs.sources import RunContext
from trnqwen.errors import redact
from trnqwen.fsutil import write_text_atomic
from trnqwen.output import number


def _num(x: Any) -> Any:
    """JSON-safe number: NaN/Inf become null (JSON has no such numbers; see ``nonfinite``)."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def method_values(log: ParsedLog) -> tuple[tuple[str, ...], dict[int, dict]]:
    """(names, step -> {name: value}) of the values beyond the step line's: every value of the
    metrics stream by name (:mod:`trnqwen.logs.stream`), else the values a method's own text
    lines gave each step, named as its metrics are (``Method.metrics``, the method's prefix
    dropped: ``<method>/margin`` is ``margin``)."""
    if log.value_names:
        return tuple(log.value_names), log.values
    for method in methods.methods():
        kept = log.method_lines.get(method.name)
        if kept is not None and kept.steps:
            prefix = method.name + "/"
            return tuple(m.name[len(prefix):] for m in method.metrics if m.name.startswith(prefix)), kept.steps
    return (), {}


def method_reports(log: ParsedLog, ctx: RunContext) -> Iterator[tuple[methods.Method, ModuleType, dict]]:
    """(method, its ``log_lines`` module, the facts its hooks get) for each method that declares
    text lines (:mod:`trnqwen.methods.base`): its ``summary`` is ``--json``'s key of its name,
    its ``rows`` the table's."""
    for method in methods.methods():
        if method.log_lines:
            yield method, methods.hook(method, "log_lines"), method_facts(log, ctx, method)


def steps_json(log: ParsedLog) -> str:
    """``--json``'s steps as JSON text, written from the columns: a row a step, numbers or null,
    then the run's other values by name, then ``line`` (the log line; null for a step of the
    metrics stream the text log lacks); Python's repr of a number is JSON's.  A row with a NaN/Inf
    value has it null and named in ``nonfinite`` (``{"loss": "nan"}``): those few rows are
    written from a dict."""
    t = log.steps
    t.compact()
    names, values = method_values(log)
    cols = [list(map(str, t.step))]
    bad = np.zeros(len(t.step), dtype=bool)
    for name in STEP_FIELDS[1:]:
        col = _reprs(t.cols[name].tolist(), whole_as_int=name == "tps")
        for i in t.missing[name]:
            col[i] = "null"
        cols.append(col)
        bad |= np.isinf(t.np(name)) | (np.isnan(t.np(name)) & t.present(name))
    rows = set(np.flatnonzero(bad).tolist())
    for name in names:
        col = [values.get(s, {}).get(name) for s in t.step]
        rows.update(i for i, v in enumerate(col) if isinstance(v, float) and not math.isfinite(v))
        cols.append([repr(v) if type(v) in (float, int) else json.dumps(v, default=str) for v in col])
    cols.append(list(map(str, t.line)))
    for i in np.flatnonzero(t.np("line") == 0).tolist():
        cols[-1][i] = "null"
    template = "{" + ", ".join(json.dumps(k).replace("%", "%%") + ": %s" for k in (*STEP_FIELDS, *names, "line")) + "}"
    text = list(map(template.__mod__, zip(*cols)))
    for i in rows:
        row = t.row(i)
        line = row.pop("line")
        row.update((k, values.get(t.step[i], {}).get(k)) for k in names)
        nonfinite = {k: _nonfinite(v) for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        row.update(dict.fromkeys(nonfinite), nonfinite=nonfinite, line=line)
        text[i] = json.dumps(row, default=str)
    return "[" + ", ".join(text) + "]"


def _reprs(col: list, whole_as_int: bool = False) -> list[str]:
    """repr of each number (``whole_as_int``: a whole one as an int), each distinct one once where
    they repeat (memory, throughput, grad norm); not with a zero among them (0.0 == -0.0, whose
    reprs differ)."""
    text = (lambda v: repr(int(v)) if v.is_integer() else repr(v)) if whole_as_int else repr
    distinct = set(col)
    if 2 * len(distinct) > len(col) or 0 in distinct:
        return list(map(text, col))
    return list(map({v: text(v) for v in distinct}.__getitem__, col))


def _nonfinite(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _identity(ctx: RunContext) -> Optional[dict]:
    ident = ctx.identity
    if ident is None or not (ident.known or ident.vocab_size or ident.num_layers):
        return None
    return {"name": ident.name, "vocab_size": ident.vocab_size, "vocab_source": ident.vocab_source,
            "layers": ident.num_layers, "layers_source": ident.layers_source}


def _column_mean(t, name: str, rows) -> Optional[float]:
    """Mean of the finite values of ``name`` in ``rows`` (Python's sum, as for a list)."""
    values = t.np(name)[rows]
    values = values[np.isfinite(values)]
    return sum(values.tolist()) / len(values) if len(values) else None


def summarize(log: ParsedLog, ctx: RunContext, findings: Optional[list[Finding]] = None) -> dict:
    """The run in one flat dict.  ``warnings`` / ``errors`` count log lines; ``findings``
    counts the judge's findings by severity (given ``findings``)."""
    t = log.steps
    n = len(t)
    rows, losses = t.finite("loss")
    best = int(rows[int(np.argmin(losses))]) if len(rows) else None
    mem_rows, mem = t.finite("memory_gib")
    peak = int(mem_rows[int(np.argmax(mem))]) if len(mem_rows) else None
    after_first = np.flatnonzero(t.np("step") > 1) if n > 1 else np.zeros(0, dtype=np.int64)
    target = configured_steps(log, ctx)
    first_step = t.step[0] if n else None
    last_step = t.step[-1] if n else None
    no_peak = no_peak_flops(log)
    codes = {f.code for f in findings or []}  # did the pretrained weights take, by the step-1 loss (None: can't tell)
    return {
        "source": log.source,
        "model": log.model_name,
        "model_flavor": log.model_flavor,
        "model_params": log.model_params,
        "torchtitan_version": log.torchtitan_version,
        "world_size": log.world_size,
        "primary_rank": log.primary_rank,
        "steps_logged": n,
        "first_step": first_step,
        "last_step": last_step,
        "configured_steps": target,
        "completed": bool(log.completed_line) or (target is not None and bool(n) and last_step >= target),
        "first_loss": _num(t.value("loss", 0)) if n else None,
        "last_loss": _num(t.value("loss", n - 1)) if n else None,
        "min_loss": t.value("loss", best) if best is not None else None,
        "min_loss_step": t.step[best] if best is not None else None,
        "peak_lr": max(lrs) if (lrs := t.finite("lr")[1].tolist()) else None,
        "last_lr": _num(t.value("lr", n - 1)) if n else None,
        "mean_tps_after_step1": _column_mean(t, "tps", after_first),
        "mean_tflops_after_step1": _column_mean(t, "tflops", after_first),
        "mean_mfu_after_step1": None if no_peak else _column_mean(t, "mfu", after_first),
        "mfu_unknown": f"no peak FLOPS known for {no_peak}" if no_peak else None,
        "step1_tps": t.value("tps", 0) if n and first_step == 1 else None,
        "peak_memory_gib": t.value("memory_gib", peak) if peak is not None else None,
        "peak_memory_pct": _num(t.value("memory_pct", peak)) if peak is not None else None,
        "peak_memory_step": t.step[peak] if peak is not None else None,
        "validation_steps": len(log.validations),
        "last_validation_loss": _num(log.validations[-1]["loss"]) if log.validations else None,
        # a load line shows that a load ran, not that the weights took: weights_loaded says that
        "checkpoint_loaded": any(e["kind"] in ("load", "loaded") for e in log.checkpoint_events),
        "weights_loaded": True if "weights-loaded" in codes else False if WEIGHTS_NOT_LOADED in codes else None,
        "model_identity": _identity(ctx),
        "checkpoint_saved": any(e["kind"] in ("save", "saved") for e in log.checkpoint_events),
        "warnings": log.warning_count,  # WARNING-level log lines
        "errors": log.error_count,  # ERROR-level log lines
        "findings": {sev: sum(1 for f in findings or [] if f.severity == sev) for sev in ("error", "warning", "info")},
        "root_cause": root_cause(log),
        "lines": log.lines,
        "bytes": log.bytes_read,
        "vocab_size": ctx.vocab_size,
        "expected_layers": ctx.num_layers,
        "run_dir": str(ctx.run_dir) if ctx.run_dir else None,
        "run_status": ctx.status,
    }


def write_json(obj: Any, out=None) -> None:
    """Write ``obj`` (or JSON text already made: :func:`json_text`'s) as one JSON document to
    ``out`` (stdout), redacted (a token a log line quoted never reaches the output)."""
    out = out or sys.stdout
    out.write(redact(obj if isinstance(obj, str) else json.dumps(obj, default=str)) + "\n")
    out.flush()


def overrides(log: ParsedLog, ctx: RunContext) -> dict[str, dict]:
    """Each override's ``[Override]`` lines (:func:`~trnqwen.logs.judge.override_table`: count,
    layers...) and its ``[OverrideCalls]`` lines (calls, fallbacks...; None: it logged none)."""
    table, calls = override_table(log, ctx.num_layers), override_calls(log)
    empty = {"count": 0, "layers": [], "missing_layers": [], "duplicate_layers": [], "other_nodes": 0, "old": None, "new": None}
    return {name: {**{k: table.get(name, empty)[k] for k in empty},
                   **{k: calls[name][k] if name in calls else None for k in ("calls", "fallbacks", "modules", "ranks", "reason")}}
            for name in [*table, *(n for n in calls if n not in table)]}


def json_text(log: ParsedLog, ctx: RunContext, findings: list[Finding]) -> str:
    """The ``--json`` document; its steps are :func:`steps_json`'s text, put in place of the null
    that stands for them (the first ``"steps": null``: the values before it are numbers or strings,
    whose quotes JSON escapes)."""
    head, _, tail = json.dumps({
        "source": log.source,
        "metrics_stream": log.metrics_stream,  # where steps and validations came from (None: the text log)
        "world_size": log.world_size,
        "model": log.model_name,
        "steps": None,
        "resumes": [{"from_step": r["from_step"], "line": r["line"]} for r in log.resumes],
        "preempted": [{"step": p["step"], "signal": p["signal"], "line": p["line"]} for p in log.preempted],
        "validation": [{k: _num(v) for k, v in rec.items() if k != "line"} for rec in log.validations],
        "overrides": overrides(log, ctx),
        "applied_overrides": [n for n, _ in log.applied.get(log.primary_rank, [])] or None,
        "lora": lora_json(log, ctx),  # the [LoRA] line (None: not a LoRA run)
        # each method's own key (its text lines' summary: settings, last values...; None: not its run)
        **{method.name: hooks.summary(facts) for method, hooks, facts in method_reports(log, ctx)},
        "checkpoint": [{k: v for k, v in e.items()} for e in log.checkpoint_events],
        "findings": [f.as_dict() for f in findings],
        "summary": summarize(log, ctx, findings),
        "tracebacks": {str(r): {"first_root": t.get("first_root"), "last": t.get("last"), "count": t.get("count")}
                       for r, t in log.tracebacks.items()},
        "evaluation": ctx.evaluation or None,  # trnqwen eval's eval.json
    }, default=str).partition('"steps": null')
    return f'{head}"steps": {steps_json(log)}{tail}'


# ---------------------------------------------------------------------------------------------
# human output


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render(log: ParsedLog, ctx: RunContext, findings: list[Finding], *, console=None) -> None:
    """The default rich summary (stdout): :func:`_table_rows`, then the findings."""
    from rich.markup import escape
    from rich.table import Table

    from trnqwen import output

    con = console or output.console(stderr=False)
    t = Table(title=f"inspect-logs: {log.source}", title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    for what, text in _table_rows(log, ctx, findings):
        if text is not None:
            t.add_row(what, text)
    con.print(t)
    if findings:
        ft = Table(title="findings", title_justify="left")
        for col in ("severity", "finding", "lines"):
            ft.add_column(col)
        for f in findings:
            style = SEVERITY_STYLE.get(f.severity, "")
            lines = ", ".join(str(x) for x in f.lines[:6]) + (" ..." if len(f.lines) > 6 else "")
            ft.add_row(f"[{style}]{f.severity}[/{style}]", escape(redact(f.message)), lines)
        con.print(ft)
    render_evaluation(ctx.evaluation, console=con)


def _table_rows(log: ParsedLog, ctx: RunContext, findings: list[Finding]) -> list[tuple[str, Optional[str]]]:
    """The summary table's (what, rich markup) rows, in order; None: the row is left out."""
    from rich.markup import escape

    s = summarize(log, ctx, findings)
    ident, fc, rc, mfu = s["model_identity"], s["findings"], s["root_cause"], s["mean_mfu_after_step1"]
    facts = ", ".join(x for x in (f"vocab {ident['vocab_size']:,}" if ident["vocab_size"] else "",
                                  f"{ident['layers']} layers" if ident["layers"] else "") if x) if ident else ""
    steps = f"{s['steps_logged']} logged"
    if s["first_step"] is not None:
        steps += f" (steps {s['first_step']}-{s['last_step']}" + (f" of {s['configured_steps']})" if s["configured_steps"] else ")")
    loaded = {True: "load ran, and the step-1 loss says the weights took",
              False: "load ran, but the step-1 loss says the weights did not take",
              None: "load ran; the base model is random by design, so the step-1 loss cannot show it took"
              if any(f.code == BASE_RANDOM_INIT for f in findings or []) else
              "load ran (whether the weights took is not known: see the findings)"}[s["weights_loaded"]]
    lora = lora_row(log, ctx)
    rows = [
        ("model", (" ".join(x for x in (s["model"], s["model_flavor"]) if x) or "-")
         + (f" ({s['model_params']:,} parameters)" if s["model_params"] else "")),
        ("model identity", escape(f"{ident['name']}: {facts} ({ident['vocab_source'] or ident['layers_source']})") if facts else None),
        ("ranks", number(s["world_size"], "")),
        ("steps", steps),
        ("loss first / last / min", " / ".join(number(s[k]) for k in ("first_loss", "last_loss", "min_loss"))
         + (f" (step {s['min_loss_step']})" if s["min_loss_step"] is not None else "")),
        ("learning rate peak / last", f"{s['peak_lr']:.4g} / {number(s['last_lr'], '.4g')}" if s.get("peak_lr") is not None else None),
        ("mean tps (after step 1)", number(s["mean_tps_after_step1"], ",.0f")
         + (f"   step 1: {number(s['step1_tps'], ',')}" if s["step1_tps"] is not None else "")),
        ("mean MFU (after step 1)", number(mfu, ".2f") + "%" if mfu is not None else f"- ({s['mfu_unknown']})" if s["mfu_unknown"] else "-"),
        ("peak memory", f"{number(s['peak_memory_gib'], '.2f')} GiB ({number(s['peak_memory_pct'], '.2f')}%) at step {s['peak_memory_step']}"
         if s["peak_memory_gib"] is not None else "-"),
        ("validation", f"{len(log.validations)} run(s), last loss {number(s['last_validation_loss'])}" if log.validations else None),
        ("checkpoint", "; ".join(x for x, on in ((loaded, s["checkpoint_loaded"]), ("saved", s["checkpoint_saved"])) if on) or "-"),
        *((override_label(name), _override_text(e)) for name, e in overrides(log, ctx).items()),
        ("LoRA", escape(lora) if lora is not None else "[yellow]configured, but no [LoRA] line logged[/yellow]" if ctx.lora else None),
        *((what, escape(redact(text))) for _, hooks, facts in method_reports(log, ctx) for what, text in hooks.rows(facts)),
    ]
    if log.metrics_stream:  # every other value of the stream, by name
        last = next((log.values[step] for step in reversed(list(log.steps)) if step in log.values), None)
        val = log.validations[-1] if log.validations else {}
        extra = {k: v for k, v in val.items() if k not in ("step", "loss", "memory_gib", "memory_pct", "tps", "line")}
        rows += [("steps from", escape(log.metrics_stream)),
                 ("values (last step)", escape(", ".join(f"{k} {number(last.get(k), '.4g')}" for k in log.value_names)) if last else None),
                 ("values (last validation)", escape(", ".join(f"{k} {number(v, '.4g')}" for k, v in extra.items())) if extra else None)]
    return rows + [("findings: errors / warnings", f"{fc['error']} / {fc['warning']}"),
                   ("log lines: WARNING / ERROR", f"{s['warnings']} / {s['errors']}"),
                   ("root cause", redact(f"rank {rc['rank']}: {rc['text']} (line {rc['line']})") if rc else None)]


def _override_text(e: dict) -> str:
    """One override's table cell: its [Override] lines (layers, missing, duplicated), its calls."""
    parts = []
    if e["count"]:
        parts.append(f"{e['count']} line(s), layers {layers_text(e['layers']) or '-'}" + "".join(
            f", [red]{what} {layers_text(e[key])}[/red]" for what, key in (("missing", "missing_layers"), ("duplicated", "duplicate_layers"))
            if e[key]))
    if e["calls"] is None:
        parts.append("[yellow]calls not reported[/yellow]")
    else:
        text = f"calls {e['calls']}, fallbacks {e['fallbacks']}"
        parts.append(f"[red]{text}[/red]" if e["calls"] == 0 or e["fallbacks"] else text)
    return redact("; ".join(parts))


def render_evaluation(evaluation: dict, *, console=None, label: str = "") -> None:
    """trnqwen eval's held-out results (eval.json) under the training summary: a loss table, or
    the table of the method's own report (its eval_report's ``table``: GRPO's reward, pass@1)."""
    if not evaluation:
        return
    from rich.markup import escape
    from rich.table import Table

    from trnqwen import output

    method = methods.find(evaluation.get("method")) if evaluation.get("method") else None
    scorer = methods.load(method.eval_report) if method is not None and method.eval_report else None
    if scorer is not None and hasattr(scorer, "table"):
        _what, headers, rows = scorer.table(evaluation.get("results", []), evaluation)
    else:
        headers = ["checkpoint", "tokens", "loss", "perplexity", "vs base"]
        rows = [[str(r.get("checkpoint")), number(r.get("tokens"), ","), number(r.get("loss")), number(r.get("perplexity"), ",.2f"),
                 "" if r.get("delta_vs_base") is None else f"{r['delta_vs_base']:+.4f}"] for r in evaluation.get("results", [])]
    t = Table(title=f"held-out eval{label} on {escape(str(evaluation.get('dataset')))}", title_justify="left")
    for col in headers:
        t.add_column(col, justify="left" if col == "checkpoint" else "right")
    for row in rows:
        t.add_row(*(escape(str(cell)) for cell in row))
    (console or output.console(stderr=False)).print(t)


# ---------------------------------------------------------------------------------------------
# CSV


def write_csv(log: ParsedLog, path: Path) -> None:
    """One row per step (``val_loss`` where a validation ran after it; the run's other values by
    name (:func:`method_values`), and ``val_`` of each where a validation ran); written to a temp
    file and renamed (never half a file)."""
    vals = {v["step"]: v for v in log.validations}
    names, values = method_values(log)
    fields = (*STEP_FIELDS, *names, "val_loss", *(f"val_{k}" for k in names), "line")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    for s in log.steps.rows():
        val = vals.get(s.get("step")) or {}
        row = {**s, **values.get(s["step"], {}), "val_loss": val.get("loss"),
               **{f"val_{k}": val.get(k) for k in names}, "line": s.get("line")}
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    write_text_atomic(path, buf.getvalue())
