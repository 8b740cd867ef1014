"""Judge a parsed run: findings with a severity, a message and the log lines that show it.

Every check is a small function of (:class:`~trnqwen.logs.record.ParsedLog`,
:class:`~trnqwen.logs.sources.RunContext`) so each can be tested on a hand-written log; each
returns its findings' fields, (severity, code, message[, lines]), as the LoRA check and the
methods' rules (which cannot import :class:`Finding`) do, and :func:`judge` makes them findings.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import groupby
from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trnqwen.contract.override_calls import override_label
from trnqwen.logs.record import HIGH_MEMORY_PCT, ParsedLog
from trnqwen.logs.identity import with_identity
from trnqwen.adapters.lora.readers import check_lora
from trnqwen.logs.patterns import no_peak_flops
from trnqwen.logs.sources import RunContext
from trnqwen.methods import registry as methods

SEVERITIES = ("error", "warning", "info")
# A step-1 loss at or above this fraction of ln(vocab) is what an untrained model gives
# (the recipe: Qwen3-4B from random init 12.43 vs ln(151936) = 11.93; from its weights 6.54).
RANDOM_INIT_FRACTION = 0.9
# With the model unnamed: ln(32000), random-init level for any common LLM vocabulary.
UNKNOWN_VOCAB_FLOOR = 32000
# The one judgement of a fine-tune whose step-1 loss is at random-init level (>= the fraction above of
# ln(vocab)): an error, whatever the model, unless the base model's card declares random weights.
WEIGHTS_NOT_LOADED = "weights-not-loaded"
BASE_RANDOM_INIT = "base-random-init"  # info: the base is random by design (builtin:tiny-qwen3)
GRAD_SPIKE_RATIO = 10.0
THROUGHPUT_DROP_RATIO = 0.5
EXPLODE_RATIO = 1.5
EXPLODE_MIN_RISE = 1.0


@dataclass
class Finding:
    severity: str  # error | warning | info
    code: str  # stable identifier, e.g. "weights-not-loaded"
    message: str
    lines: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lines = sorted({x for x in self.lines if isinstance(x, int) and not isinstance(x, bool)})

    def as_dict(self) -> dict:
        return asdict(self)


def judge(log: ParsedLog, ctx: Optional[RunContext] = None) -> list[Finding]:
    """All findings, errors first."""
    ctx = ctx or RunContext()
    if ctx.identity is None:
        ctx = with_identity(log, ctx)
    checks = (_check_input, _check_steps_present, _check_weights_loaded, _check_overrides, _check_override_calls, check_lora,
              _check_methods, _check_nonfinite, _check_exploding, _check_grad_spikes, _check_memory, _check_throughput,
              _check_crash, _check_stopped_early, _check_ranks, _check_warnings)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted((Finding(*fields) for check in checks for fields in check(log, ctx)),
                  key=lambda f: (order.get(f.severity, 9), f.lines[0] if f.lines else 0))


# ---------------------------------------------------------------------------------------------


def method_facts(log: ParsedLog, ctx: RunContext, method: methods.Method) -> dict:
    """What a method's hooks (judge rules, ``--json`` key, table rows) get, as plain data
    (:mod:`trnqwen.methods.base`): first step, start, its own lines, validations, run config."""
    first = log.steps.row(0) if log.steps else None
    kept = log.method_lines.get(method.name)
    return {"first_step": {k: first[k] for k in ("step", "loss", "line")} if first else None,
            "start_step": log.start_step, "lines": {"steps": kept.steps if kept else {}, "notes": kept.notes if kept else {}},
            "validations": log.validations, "run_config": dict(ctx.run_config) if ctx.run_config else None}


def run_method(log: ParsedLog, ctx: RunContext) -> Optional[methods.Method]:
    """The method this run trained with: the one whose lines the log has, else the run config's (None: unknown)."""
    logged = next((m for m in methods.methods() if m.name in log.method_lines), None)
    named = (ctx.run_config or {}).get("method")
    return logged or (methods.find(named) if named else None)


def _check_methods(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    """Each training method's own rules (``Method.judge``, e.g. a preference loss's step-1 value)."""
    return [fields for method in methods.methods() if method.judge
            for fields in methods.hook(method, "judge")(method_facts(log, ctx, method))]


def _check_input(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    restarts = unexplained_restarts(log)
    rules = [  # (whether it applies, then the finding's fields)
        (log.ends_mid_line, "info", "truncated-line",
         f"the log ends mid-line (line {log.lines}): it was cut off or is still being written", [log.lines]),
        (log.overlong_lines, "warning", "overlong-lines",
         f"{len(log.overlong_lines)} line(s) longer than the line cap were cut", log.overlong_lines[:10]),
        (log.invalid_utf8_lines, "info", "invalid-utf8",
         f"{log.invalid_utf8_lines} line(s) are not valid UTF-8 (shown with replacement characters)", [log.first_invalid_utf8_line]),
        *((True, "info", "resumed", f"resumed from step {r['from_step']} at line {r['line']} (trnqwen train --resume): one run",
           [r["line"]]) for r in log.resumes),
        *((True, "warning", "preempted", f"preempted by {p['signal']} at step {p['step']}: a resumable checkpoint was saved; "
           "continue with `trnqwen train --resume`", [p["line"]]) for p in _unresumed_preemptions(log)),
        (restarts, "warning", "restarted", f"the step counter went back {len(restarts)} time(s): the run restarted or resumed; "
         "the latest value of each step is kept", restarts[:10]),
    ]
    return [tuple(fields) for applies, *fields in rules if applies]


def _unresumed_preemptions(log: ParsedLog) -> list[dict]:
    """The preemptions after the last resume (the run has not continued from them yet)."""
    return [p for p in log.preempted if p["line"] > (log.resumes[-1]["line"] if log.resumes else 0)]


def unexplained_restarts(log: ParsedLog) -> list[int]:
    """The lines where the step counter went back, less those a ``trnqwen train --resume`` explains:
    the first step line after a resume line, going back to just after the step it resumed from
    (the stopped attempt had logged steps past its last checkpoint; they ran again)."""
    if not log.restarts or not log.resumes:
        return list(log.restarts)
    lines, steps = log.steps.np("line"), log.steps.np("step")
    marks = sorted((r["line"], r["from_step"]) for r in log.resumes)
    out = []
    for at in log.restarts:
        before = [m for m in marks if m[0] < at]
        if before:
            resume_line, from_step = before[-1]
            between = (lines > resume_line) & (lines < at)
            here = steps[lines == at]
            if not between.any() and here.size and int(here[0]) > from_step:
                continue  # the resumed run's first step
        out.append(at)
    return out


def on_cpu(log: ParsedLog) -> bool:
    """torchtitan said it has no peak FLOPS for a CPU: the run trained on the host's cores."""
    return (no_peak_flops(log) or "").upper().startswith("CPU")


def run_is_live(ctx: RunContext) -> bool:
    """run.json says the run has not ended (being set up, or running)."""
    return ctx.record is not None and ctx.record.status in ("running", "created") and not ctx.ended


def _check_steps_present(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    if log.steps:
        return []
    if run_is_live(ctx):  # still starting (ranks loading, compiling): nothing is wrong yet
        what = "no log line yet" if not log.bytes_read else "no step logged yet"
        return [("info", "starting", f"the run is still starting ({what}; run.json: {ctx.record.status}): "
                 "watch it with `trnqwen inspect-logs --follow`")]
    return [("error", "no-steps", "no training step was logged (no `step: N  loss: ...` line)")]


def _check_weights_loaded(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    """Step-1 loss against the random-init level ln(vocab): the model's identity comes from the
    run directory or the flags, else from the log itself (:mod:`trnqwen.logs.identity`).  Not for
    a run of a method whose loss is not the next-token loss (a preference loss: ln 2 at step 1),
    judged by that method's own rules."""
    method = run_method(log, ctx)
    if not log.steps or (method is not None and not method.token_loss):
        return []
    first = log.steps.row(0)
    loss = first["loss"]
    if first["step"] != 1 or log.start_step not in (None, 1) or loss is None or not math.isfinite(loss):
        return []  # a resumed run (step 1 is not in this log), or no loss to judge
    load_lines = [e["line"] for e in log.checkpoint_events if e["kind"] in ("load", "loaded")]
    fresh = [e["line"] for e in log.checkpoint_events if e["kind"] == "fresh"]
    finetune = True if ctx.finetune is None and load_lines else ctx.finetune
    ran = (f"; line {load_lines[0]} shows a checkpoint load ran, which is not proof the weights took"
           if load_lines else "")
    vocab, source = ctx.vocab_size, ctx.vocab_source or "run"
    if not vocab or vocab < 2:
        floor = math.log(UNKNOWN_VOCAB_FLOOR)
        if finetune and load_lines and not fresh and loss >= floor:
            return [("warning", "weights-maybe-not-loaded",
                     f"step-1 loss {loss:.2f} is at or above ln {UNKNOWN_VOCAB_FLOOR} = {floor:.2f}, random-init level for "
                     f"any common vocabulary{ran}; the log does not name the model (pass --vocab-size to check exactly)",
                     [first["line"], *load_lines[:2]])]
        return [("info", "vocab-unknown",
                 f"step-1 loss {loss:.4f}; vocab size unknown, so it can't be compared with a random-init loss "
                 "(pass --vocab-size or inspect a run directory)", [first["line"]])]
    ln_v = math.log(vocab)
    if loss < RANDOM_INIT_FRACTION * ln_v:
        return [("info", "weights-loaded", f"step-1 loss {loss:.4f} is well below ln(vocab {vocab}) = {ln_v:.2f}: the pretrained "
                 "weights were used", [first["line"]])] if finetune else []
    known = ctx.identity.known if ctx.identity is not None else None
    level = f"step-1 loss {loss:.2f} is random-init level (ln {vocab} = {ln_v:.2f})"
    whence = f" [vocab from {source}]"
    if finetune:
        if ctx.base_random_init and not fresh:  # builtin:tiny-qwen3: its published weights are random by design
            return [("info", BASE_RANDOM_INIT,
                     f"{level}, as expected: the base model's card says its weights are random by design "
                     f"(builtin:tiny-qwen3), so the step-1 loss cannot show whether they were loaded{whence}",
                     [first["line"], *load_lines[:2]])]
        reference = (f"; loaded Qwen3-{known.size} starts near {known.loaded_step1_loss:.2f}"
                     if known is not None and known.loaded_step1_loss else "")
        return [("error", WEIGHTS_NOT_LOADED, f"weights were probably not loaded: {level}{reference}{ran}{whence}",
                 [first["line"], *load_lines[:2], *fresh[:1]])]
    if finetune is False or fresh:
        return [("info", "from-scratch", f"{level}, as expected for a run from random init{whence}", [first["line"], *fresh[:1]])]
    return [("warning", "weights-maybe-not-loaded",
             f"{level}; if this run was meant to fine-tune, the weights were not loaded{whence}", [first["line"]])]


def override_table(log: ParsedLog, num_layers: Optional[int]) -> dict[str, dict]:
    """Override name -> {count, layers, missing_layers, duplicate_layers, other_nodes, lines}
    from the primary rank's ``[Override]`` lines."""
    table: dict[str, dict] = {}
    for rec in log.primary_overrides():
        entry = table.setdefault(rec["name"], {"count": 0, "layers": [], "missing_layers": [], "duplicate_layers": [],
                                               "other_nodes": 0, "old": rec["old"], "new": rec["new"], "lines": []})
        entry["count"] += 1
        if len(entry["lines"]) < 1000:
            entry["lines"].append(rec["line"])
        if rec["layer"] is None:
            entry["other_nodes"] += 1
        else:
            entry["layers"].append(rec["layer"])
    for entry in table.values():
        counts = Counter(entry["layers"])
        entry["duplicate_layers"] = sorted(k for k, v in counts.items() if v > 1)
        entry["layers"] = sorted(counts)
        if counts:  # without a layer count, gaps inside the range seen are still missing
            entry["missing_layers"] = sorted(set(range(num_layers or max(counts) + 1)) - set(counts))
    return table


def layers_text(layers: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2, 5, 7-8' (runs of ``layers``, sorted)."""
    runs = [[x for _, x in run] for _, run in groupby(enumerate(layers), lambda ix: ix[1] - ix[0])]
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _check_overrides(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    out = [("error", "override-no-match", f"override.imports={rec['imports']} produced no replacements: its target/fqns match "
            "no config node", [rec["line"]]) for rec in log.override_no_match]
    table = override_table(log, ctx.num_layers)
    if not table:
        return out
    n = ctx.num_layers
    for name, entry in table.items():
        lines = entry["lines"]
        if not entry["layers"]:
            continue
        if entry["missing_layers"]:
            scope = f"of {n} layers ({ctx.layers_source})" if n else "inside the range of layers seen"
            out.append(("error", "override-missing-layers",
                        f"override {name} is missing on layer(s) {layers_text(entry['missing_layers'])} {scope}", lines[:3]))
        if entry["duplicate_layers"]:
            dup_lines = [r["line"] for r in log.primary_overrides() if r["name"] == name and r["layer"] in set(entry["duplicate_layers"])]
            out.append(("error", "override-duplicate-layers",
                        f"override {name} was applied more than once on layer(s) {layers_text(entry['duplicate_layers'])}",
                        dup_lines[:10]))
        if n and entry["layers"] and max(entry["layers"]) >= n:
            extra = [x for x in entry["layers"] if x >= n]
            out.append(("warning", "override-extra-layers",
                        f"override {name} names layer(s) {layers_text(extra)} beyond the {n} layers expected ({ctx.layers_source})",
                        lines[:3]))
        if not entry["missing_layers"] and not entry["duplicate_layers"]:
            what = f"all {n} layers" if n else f"layers {layers_text(entry['layers'])}"
            out.append(("info", "override-ok", f"{override_label(name)}: exactly once on {what} ({entry['old']} -> {entry['new']})", lines[:1]))
    if not n:
        out.append(("info", "layers-unknown",
                    "the model's layer count is unknown, so missing layers at the end can't be seen (pass --expect-layers N)"))
    # "Applied N override(s)" against the lines seen, per rank
    primary = log.primary_rank if log.primary_rank in log.applied else next(iter(log.applied), None)
    for count, line in log.applied.get(primary, [])[-1:]:
        if count != len(log.overrides.get(primary, [])):
            out.append(("warning", "override-count-mismatch", f"torchtitan says it applied {count} override(s), "
                        f"but {len(log.overrides.get(primary, []))} [Override] line(s) were logged", [line]))
    counts = {r: len(v) for r, v in log.overrides.items() if r is not None}
    if len(set(counts.values())) > 1:
        base = len(log.primary_overrides())
        odd = sorted(r for r, c in counts.items() if c != base)
        out.append(("warning", "override-rank-mismatch",
                    f"rank(s) {layers_text(odd)} logged a different number of [Override] lines than rank {log.primary_rank} ({base})",
                    [log.overrides[r][0]["line"] for r in odd[:3] if log.overrides[r]]))
    return out


def override_calls(log: ParsedLog) -> dict[str, dict]:
    """Override name -> {calls, fallbacks, modules, ranks, reason, lines}, summed over the ranks'
    ``[OverrideCalls]`` lines (``modules``: the most any one rank ran it on)."""
    out: dict[str, dict] = {}
    for name, per_rank in log.override_calls.items():
        recs = [per_rank[r] for r in sorted(per_rank)]
        out[name] = {
            "calls": sum(r["calls"] for r in recs), "fallbacks": sum(r["fallbacks"] for r in recs),
            "modules": max(r["modules"] for r in recs), "ranks": sorted(per_rank),
            "reason": next((r["reason"] for r in recs if r["reason"]), None), "lines": [r["line"] for r in recs],
        }
    return out


def _check_override_calls(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    """An override is healthy only when its code ran: an ``[Override]`` line says it was put in
    place, its ``[OverrideCalls]`` line says how many calls ran it and how many fell back."""
    out = []
    calls = override_calls(log)
    applied = override_table(log, ctx.num_layers)
    for name, c in calls.items():
        where = f"{c['calls'] + c['fallbacks']} call(s) on {len(c['ranks'])} rank(s)"
        why = f": {c['reason']}" if c["reason"] else ""
        if c["calls"] == 0 and c["fallbacks"] == 0:
            out.append(("error", "override-never-ran",
                        f"override {name} was installed but never called: its code did not run", c["lines"][:3]))
        elif c["calls"] == 0:
            out.append(("error", "override-always-fell-back",
                        f"override {name} fell back on every call ({where}): its own code never ran{why}", c["lines"][:3]))
        elif c["fallbacks"]:
            out.append(("warning", "override-fallbacks",
                        f"override {name} fell back on {c['fallbacks']} of {where}{why}", c["lines"][:3]))
        replaced = applied.get(name, {}).get("count", 0)
        if c["calls"] and replaced and c["modules"] < replaced:
            out.append(("warning", "override-idle-layers",
                        f"override {name} ran on {c['modules']} module(s) of the {replaced} it replaced", c["lines"][:3]))
        elif c["calls"] and not c["fallbacks"]:
            out.append(("info", "override-ran",
                        f"{override_label(name)} ran its own code: {c['calls']} call(s) on {c['modules']} module(s), "
                        f"no fallback ({len(c['ranks'])} rank(s))", c["lines"][:1]))
    return out + [("warning", "override-unverified", f"override {name} was applied but logged no [OverrideCalls] line, so nothing "
                   "shows its code ran (one [Override] line per layer proves only that it was installed)", entry["lines"][:1])
                  for name, entry in applied.items() if log.steps and name not in calls]


def _check_nonfinite(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    t = log.steps
    bad = {key: np.flatnonzero(~np.isfinite(t.np(key)) & t.present(key)).tolist() for key in ("loss", "grad_norm")}
    return [("error", f"nonfinite-{key.replace('_', '-')}",
             f"{key.replace('_', ' ')} is {t.value(key, rows[0])} from step {t.step[rows[0]]} ({len(rows)} step(s) in all)",
             [t.line[j] or None for j in rows[:5]]) for key, rows in bad.items() if rows]


def _check_exploding(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    t = log.steps
    rows, loss = t.finite("loss")
    if len(rows) < 2:
        return []
    first = float(loss[0])
    best = np.minimum.accumulate(loss)[:-1]  # lowest before each later step
    rise = (loss[1:] > np.maximum(first, best) * EXPLODE_RATIO) & (loss[1:] - best > EXPLODE_MIN_RISE)
    hit = np.flatnonzero(rise)
    if not hit.size:
        return []
    k = int(hit[0]) + 1
    i = int(rows[k])
    return [("error", "loss-exploding",
             f"loss rose to {float(loss[k]):.4f} at step {t.step[i]} (first {first:.4f}, lowest so far {float(best[k - 1]):.4f}): "
             "training is diverging", [t.line[i] or None])]


def _rolling_medians(values, width: int, start: int):
    """median(values[max(0, i - width):i]) for i in start..len-1 (numpy; the short windows at
    the start as statistics.median computes them)."""
    n = len(values)
    head = [statistics.median(values[max(0, i - width):i].tolist()) for i in range(start, min(width, n))]
    tail = np.zeros(0)
    if n > width:  # np.median's result (the values are finite), without its import of numpy.ma
        ordered = np.sort(sliding_window_view(values, width)[: n - width], axis=1)
        mid = width // 2
        tail = ordered[:, mid] if width % 2 else (ordered[:, mid - 1] + ordered[:, mid]) / 2
    return np.concatenate([np.asarray(head, dtype=np.float64), tail])


def _check_grad_spikes(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    t = log.steps
    rows, grad = t.finite("grad_norm")
    if len(rows) < 4:
        return []
    med = _rolling_medians(grad, 8, 3)  # for steps 3.. of the finite ones
    spike = np.flatnonzero((med > 0) & (grad[3:] > GRAD_SPIKE_RATIO * med))
    if not spike.size:
        return []
    k = int(spike[0])
    i = int(rows[k + 3])
    return [("warning", "grad-norm-spike",
             f"grad norm spiked to {float(grad[k + 3]):.4g} at step {t.step[i]} (median of the steps before: {float(med[k]):.4g}); "
             f"{spike.size} spike(s) over {GRAD_SPIKE_RATIO:g}x", [t.line[int(rows[j + 3])] or None for j in spike[:5].tolist()])]


def _check_memory(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    t = log.steps
    rows, pct = t.finite("memory_pct")
    high = rows[pct > HIGH_MEMORY_PCT]
    ranks = {r: v for r, v in log.rank_high_memory.items() if v["pct"] > HIGH_MEMORY_PCT}
    if not high.size and not ranks:
        return []
    if high.size:
        i = int(high[int(np.argmax(t.np("memory_pct")[high]))])
        lines = [t.line[i] or None]
        msg = (f"device memory reached {t.value('memory_pct', i):.2f}% ({t.value('memory_gib', i)} GiB) at step {t.step[i]}"
               f" on rank {log.primary_rank if log.primary_rank is not None else 0}: near capacity (>{HIGH_MEMORY_PCT:g}%)")
    else:
        r, v = max(ranks.items(), key=lambda kv: kv[1]["pct"])
        lines = [v["line"]]
        msg = f"device memory reached {v['pct']:.2f}% on rank {r} at step {v['step']}: near capacity (>{HIGH_MEMORY_PCT:g}%)"
    others = sorted(r for r in ranks if r != log.primary_rank)
    if others:
        msg += f"; ranks above {HIGH_MEMORY_PCT:g}%: {layers_text(others)}"
        lines += [ranks[r]["line"] for r in others[:3]]
    return [("warning", "memory-high", msg, sorted(set(x for x in lines if x is not None)))]


def _check_throughput(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    t = log.steps
    rows, tps = t.finite("tps")
    # each process's first step (step 1, the one after each resume point) includes start-up and compilation
    firsts = np.array([1, *(int(r["from_step"]) + 1 for r in log.resumes if r.get("from_step") is not None)])
    keep = ~np.isin(t.np("step")[rows], firsts)
    rows, tps = rows[keep], tps[keep]
    if len(rows) < 3:
        return []
    base = _rolling_medians(tps, 5, 2)  # for steps 2.. of these
    for k in np.flatnonzero((base > 0) & (tps[2:] < THROUGHPUT_DROP_RATIO * base)).tolist():
        b = float(base[k])
        rest = statistics.median(tps[k + 2:k + 52].tolist())  # it stays down (not a one-step hiccup)
        if rest < THROUGHPUT_DROP_RATIO * b:
            i = int(rows[k + 2])
            text = (f"throughput fell to {t.value('tps', i):,} tps at step {t.step[i]} from about {b:,.0f} tps "
                    f"and stayed below {THROUGHPUT_DROP_RATIO:.0%} of it (each start's first step excluded: it includes compilation)")
            cpu = on_cpu(log)  # the cores are the host's: other processes (a cold start's) take them
            return [("info" if cpu else "warning", "throughput-collapse",
                     text + ("; on CPU throughput follows the host's load" if cpu else ""), [t.line[i] or None])]
    return []


def root_cause(log: ParsedLog) -> Optional[dict]:
    """The crash's first root-cause line: {rank, text, line, final, traceback_start}, or None: the
    traceback of torchrun's root-cause rank, else the earliest rank's, else the launcher's own (not
    torchrun's ChildFailedError), else the error line of torchrun's summary."""
    failure = log.torchrun_failure
    ranked = {r: t for r, t in log.tracebacks.items() if r is not None and t.get("first_root")}
    pick = failure.get("root_cause_rank")
    if pick not in ranked:
        pick = min(ranked, key=lambda r: ranked[r]["first_root"]["line"], default=None)
    own = log.tracebacks.get(None)
    if pick is None and own and own.get("first_root") and "ChildFailedError" not in own["first_root"]["text"]:
        ranked[None] = own
    t = ranked.get(pick)
    if t is not None:
        return {"rank": pick, "text": t["first_root"]["text"], "line": t["first_root"]["line"],
                "final": t["last"]["text"] if t.get("last") else None, "traceback_start": t.get("start")}
    if failure.get("error"):
        return {"rank": failure.get("root_cause_rank"), "text": failure["error"], "line": failure.get("root_cause_line"),
                "final": None, "traceback_start": None}
    return None


# A rank or torchrun stopped by Ctrl-C / SIGTERM: the "root cause" is the signal, not a crash.
_INTERRUPT = re.compile(r"^(KeyboardInterrupt\b|\S*SignalException: Process \d+ got signal: (2|10|15)\b)")
_SIGNAL_NAMES = {"2": "SIGINT (Ctrl-C)", "10": "SIGUSR1", "15": "SIGTERM"}


def _check_crash(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    out = []
    cause = root_cause(log)
    failure = log.torchrun_failure
    record = ctx.record
    if cause is not None and log.preempted and "SignalException" in cause["text"]:
        return out  # torchrun relaying the preemption signal; the ranks saved (see "preempted")
    lines = [cause["traceback_start"], cause["line"]] if cause is not None else []
    if cause is not None and _INTERRUPT.match(cause["text"]):
        how = record.ended_by if record is not None and record.ended_by in ("SIGINT", "SIGTERM", "SIGUSR1") else (
            _SIGNAL_NAMES.get(cause["text"].rstrip().rsplit(" ", 1)[-1], "SIGINT (Ctrl-C)"))
        return [("warning", "interrupted", f"the run was interrupted by {how}, not crashed ({len(log.steps)} step(s) logged)", lines)]
    if cause is not None:
        who = f"rank {cause['rank']}" if cause["rank"] is not None else "the launcher"
        msg = f"{who} crashed: {cause['text']}"
        if cause.get("final") and cause["final"] != cause["text"]:
            msg += f" (surfaced as: {cause['final']})"
        others = sorted(r for r, t in log.tracebacks.items() if r is not None and r != cause["rank"] and t.get("first_root"))
        if others:
            msg += f"; {len(others)} other rank(s) also raised"
        out.append(("error", "crash", msg, lines))
    elif failure.get("exitcode") is not None or failure.get("failed"):
        code = failure["exitcode"] if failure.get("exitcode") is not None else failure["failed"][0]["exitcode"]
        rank = failure.get("root_cause_rank")
        sig = ({-9: " (SIGKILL: often the host's out-of-memory killer)", -15: " (SIGTERM)", -6: " (SIGABRT)", -11: " (SIGSEGV)"}
               .get(code, f" (signal {-code})") if isinstance(code, int) and code < 0 else "")
        lines = [x for x in (failure.get("root_cause_line"), *(f["line"] for f in failure.get("failed", [])[:2])) if x]
        found = record.error if record is not None and record.error and "no error message" not in record.error else None
        tail = f"; the launcher found: {found}" if found else "; no traceback in the log"
        out.append(("error", "crash", f"rank {rank if rank is not None else '?'} exited with code {code}{sig}{tail}", lines))
    elif log.errors:
        first = log.errors[0]
        who = f"rank {first['rank']}" if first["rank"] is not None else "the log"
        out.append(("error", "error-lines", f"{log.error_count} ERROR line(s); first from {who}: {first['text']}", [first["line"]]))
    if cause is not None and log.errors:
        out.append(("info", "error-lines", f"{log.error_count} ERROR-level line(s) besides the traceback", [log.errors[0]["line"]]))
    if record is not None and record.status == "failed" and not out:
        out.append(("error", "run-failed", f"the run record says it failed ({record.ended_by or 'no reason'}): {record.error or 'no root cause recorded'}"))
    return out


def configured_steps(log: ParsedLog, ctx: RunContext) -> Optional[int]:
    return log.trainer.get("steps") or ctx.configured_steps


def _check_stopped_early(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    if not log.steps:
        return []
    target = configured_steps(log, ctx)
    last = max(log.steps)
    out = []
    if log.ran_out_of_data_line:
        out.append(("warning", "ran-out-of-data", f"the data ran out at step {last}: training stopped early",
                    [log.ran_out_of_data_line]))
    if target and last < target:
        if run_is_live(ctx):
            out.append(("info", "in-progress", f"the run is still going: step {last} of {target}", [log.steps[last]["line"]]))
        elif _unresumed_preemptions(log):  # saved and resumable: the "preempted" warning says how to continue
            out.append(("info", "stopped-early", f"the run stopped at step {last} of {target} configured steps "
                        "(preempted with a resumable checkpoint)", [log.steps[last]["line"]]))
        else:
            ended_by = ctx.record.ended_by if ctx.record is not None else None
            why = f" (ended by {ended_by})" if ended_by and ended_by != "completed" else ""
            out.append(("error", "stopped-early", f"the run stopped at step {last} of {target} configured steps{why}",
                        [log.steps[last]["line"]]))
    elif target and last >= target and log.completed_line:
        out.append(("info", "completed", f"training completed all {target} steps", [log.completed_line]))
    return out


def _check_ranks(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    if not log.steps or len(log.rank_last_step) < 2:
        return []
    top = max(s for s, _ in log.rank_last_step.values())
    # one step behind at the very end is interleaving (or a cut-off log); more is a lagging rank
    behind = {r: v for r, v in log.rank_last_step.items() if v[0] < top - 1 or (log.completed_line and v[0] < top)}
    if not behind:
        return []
    worst = min(behind.items(), key=lambda kv: kv[1][0])
    return [("warning", "rank-behind",
             f"{len(behind)} rank(s) logged fewer steps than the others (step {top}); rank {worst[0]} stopped at step {worst[1][0]}",
             [v[1] for _, v in sorted(behind.items())[:5]])]


def _check_warnings(log: ParsedLog, ctx: RunContext) -> list[tuple]:
    if not log.warning_count:
        return []
    top = sorted(log.warnings.values(), key=lambda w: (-w["count"], w["line"]))[:3]
    shown = "; ".join(f"{w['text'][:120]} (x{w['count']})" for w in top)
    return [("info", "warnings", f"{log.warning_count} warning line(s), {len(log.warnings)} distinct; most frequent: {shown}",
             [w["line"] for w in top])]
