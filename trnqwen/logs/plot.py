"""``--plot FILE.png``: loss, grad norm, throughput/MFU and (when logged) the learning rate against
step (matplotlib, Agg); a run with other values (every value of its metrics stream, the values
of a method's own text lines) adds a panel of them, by name."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from trnqwen.fsutil import write_atomic
from trnqwen.logs.judge import run_method
from trnqwen.logs.patterns import no_peak_flops
from trnqwen.logs.record import ParsedLog
from trnqwen.logs.report import method_values
from trnqwen.logs.sources import RunContext

_DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".csv", ".gz", ".zst")


def _value_series(log: ParsedLog, name: str, *, validation: bool = False) -> tuple[list[int], list[float]]:
    """One of the run's other values (:func:`trnqwen.logs.report.method_values`) by step
    (``validation``: of the validations)."""
    recs = [(v["step"], v) for v in log.validations] if validation else sorted(method_values(log)[1].items())
    pts = [(step, float(rec[name])) for step, rec in recs
           if isinstance(rec.get(name), (int, float)) and math.isfinite(rec[name])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _plot_values(ax, run: ParsedLog, style: str, suffix: str) -> None:
    """Every other value of the run on ``ax`` (a preference method's rewards, margin, accuracy;
    any value its metrics stream has), validations as squares."""
    for name in method_values(run)[0]:
        x, y = _value_series(run, name)
        line, = ax.plot(x, y, style, marker="o" if len(x) <= 50 else None, ms=3, label=f"{name}{suffix}")
        x, y = _value_series(run, name, validation=True)
        if x:
            ax.plot(x, y, style, marker="s", ms=4, color=line.get_color(), alpha=0.6, label=f"validation {name}{suffix}")


def _series(log: ParsedLog, key: str) -> tuple[list[int], list[float]]:
    """The steps and values of ``key`` where it was logged and is finite."""
    rows, values = log.steps.finite(key)
    return log.steps.np("step")[rows].tolist(), values.tolist()


def run_plot_title(log: ParsedLog, ctx: Optional[RunContext] = None) -> str:
    """What names a run on a plot: its run directory's name, else the log's file name (not the
    whole path, which can be longer than the figure is wide), then what was trained, as far as
    ``ctx`` knows it: the model (the record's base model, the one actually trained, else the
    config's), the method its log or config names (``sft + LoRA r16``) and the dataset (a file by
    its name; the model's default corpus)."""
    name = Path(ctx.run_dir).name if ctx is not None and ctx.run_dir is not None else (Path(log.source).name or log.source)
    if ctx is None:
        return name
    cfg = ctx.run_config or {}
    extra = ctx.record.extra if ctx.record is not None and isinstance(ctx.record.extra, dict) else {}
    facts = [str(model)] if (model := extra.get("base_model") or cfg.get("model")) else []
    method = run_method(log, ctx)
    method = method.name if method is not None else cfg.get("method")
    if method:
        facts.append(f"{method} + LoRA r{cfg.get('lora_rank', '?')}" if cfg.get("lora") else str(method))
    if "dataset" in cfg:
        data = str(cfg.get("dataset") or "")
        local = data.startswith((".", "/", "~")) or data.lower().endswith(_DATA_FILE_SUFFIXES) or Path(data).expanduser().exists()
        # a local file or folder by its name (a path can be wider than the figure); a Hub name (org/name) whole
        facts.append(((Path(data).name or data) if local else data) if data else "the model's default corpus")
    return f"{name}: {', '.join(facts)}" if facts else name


def write_plot(log: ParsedLog, path: Path, *, other: Optional[ParsedLog] = None, title: Optional[str] = None,
               evaluations: Optional[list[dict]] = None) -> None:
    """Three stacked panels sharing the step axis (four with the learning rate, one more for the
    run's other values), written atomically."""
    save_figure_atomic(build_figure(log, other=other, title=title, evaluations=evaluations), Path(path))


def build_figure(log: ParsedLog, *, other: Optional[ParsedLog] = None, title: Optional[str] = None,
                 evaluations: Optional[list[dict]] = None):
    """The figure of :func:`write_plot`.  Step 1 is marked on the throughput panel when the log
    says something was compiled (then it includes the compilation); a preemption and each resume
    are marked on every panel; MFU is left out when torchtitan knew no peak for the device (CPU).
    With ``other``, both runs are drawn (A solid, B dashed).  Legends sit outside the panels, so
    that no data point is hidden under one."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = [(None, log, "-")] if other is None else [("A", log, "-"), ("B", other, "--")]
    with_lr = any(_series(run, "lr")[0] for _, run, _ in runs)
    with_values = any(method_values(run)[0] for _, run, _ in runs)
    n_panels = 3 + with_lr + with_values
    fig, axes = plt.subplots(n_panels, 1, figsize=(11, 3 + 2 * n_panels), sharex=True, constrained_layout=True)
    ax_loss, ax_grad, ax_tps = axes[:3]
    ax_lr = axes[3] if with_lr else None
    ax_values = axes[-1] if with_values else None
    with_mfu = any(no_peak_flops(run) is None and _series(run, "mfu")[0] for _, run, _ in runs)
    ax_mfu = ax_tps.twinx() if with_mfu else None
    # the training loss sets the loss panel's scale; validation and held-out losses of another scale
    # (a preference run's held-out answer loss, 7.6 beside its 0.69) go on a twin axis, or they would flatten it
    train_losses = [v for _, run, _ in runs for v in _series(run, "loss")[1]]
    ax_loss_other = None

    def loss_axis(values: list[float]):
        nonlocal ax_loss_other
        if not _other_scale(values, train_losses):
            return ax_loss
        if ax_loss_other is None:
            ax_loss_other = ax_loss.twinx()
        return ax_loss_other

    for label, run, style in runs:
        suffix = f" ({label})" if label else ""
        for ax, key, color, label in ((ax_loss, "loss", "tab:blue", "loss"), (ax_grad, "grad_norm", "tab:orange", "grad norm"),
                                      (ax_tps, "tps", "tab:purple", "tokens/s/device"), (ax_lr, "lr", "tab:brown", "learning rate")):
            x, y = _series(run, key)
            if ax is not None and (x or key != "lr"):
                ax.plot(x, y, style, marker="o" if len(x) <= 50 else None, ms=3, color=color, label=f"{label}{suffix}")
        vx, vy = _value_series(run, "loss", validation=True)
        if vx:
            loss_axis(vy).plot(vx, vy, style, marker="s", ms=4, color="tab:green", label=f"validation loss{suffix}")
        x, y = _series(run, "mfu")
        if ax_mfu is not None and x and no_peak_flops(run) is None:
            ax_mfu.plot(x, y, style, color="tab:red", alpha=0.7, label=f"MFU %{suffix}")
        if ax_values is not None:
            _plot_values(ax_values, run, style, suffix)
    # trnqwen eval's held-out losses (eval.json): the base before step 1, the export at its step
    held_out = [(n, ev, r) for n, ev in enumerate(evaluations or []) for r in (ev or {}).get("results", [])
                if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"]) and isinstance(ev.get("step"), int)]
    ax_held = loss_axis([r["loss"] for _, _, r in held_out]) if held_out else ax_loss
    for n, ev, r in held_out:
        base = r.get("checkpoint") == "base"
        tag = f" ({'AB'[n]})" if other is not None else ""
        ax_held.plot([0 if base else ev["step"]], [r["loss"]], "x" if base else "*", ms=9,
                     label=f"held-out {'base' if base else r['checkpoint']}{tag}")
    # Non-finite losses: mark where they happened.
    bad = log.steps.np("step")[~np.isfinite(log.steps.np("loss")) & log.steps.present("loss")].tolist()
    for st in bad[:50]:
        ax_loss.axvline(st, color="red", alpha=0.3, lw=1)
    if bad:
        ax_loss.plot([], [], color="red", alpha=0.5, label="NaN/Inf loss")
    panels = [ax_loss, ax_grad, ax_tps, *(a for a in (ax_lr, ax_values) if a is not None)]
    _mark_interruptions(log, panels)
    if log.compiled_line is not None and 1 in log.steps:
        ax_tps.axvspan(0.5, 1.5, color="grey", alpha=0.15, label="step 1 (compilation)")
    for ax, label in ((ax_loss, "loss"), (ax_grad, "grad norm"), (ax_tps, "tokens / s / device"), (ax_mfu, "MFU (%)"),
                      (ax_lr, "learning rate"), (ax_values, "other values")):
        if ax is not None:
            ax.set_ylabel(label)
    if ax_loss_other is not None:
        kinds = dict.fromkeys("held-out loss" if ln.get_label().startswith("held-out") else "validation loss"
                              for ln in ax_loss_other.get_lines())
        ax_loss_other.set_ylabel(f"{' / '.join(kinds)}\n(another scale)")
    if ax_mfu is not None:
        ax_mfu.set_ylim(bottom=0)  # an honest scale: a 0.1-point wobble should look like one
    if ax_values is not None:
        ax_values.axhline(0.0, color="grey", lw=0.8, alpha=0.5)
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in panels:
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        twin = {ax_tps: ax_mfu, ax_loss: ax_loss_other}.get(ax)
        if twin is not None:
            h2, l2 = twin.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        if not handles:
            continue
        # outside the panel, on its right: never over a data point (the last throughput points were)
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.08 if twin is not None else 1.01, 1),
                  fontsize=8, borderaxespad=0)
    if title is None:
        title = run_plot_title(log) if other is None else f"A: {run_plot_title(log)}\nB: {run_plot_title(other)}"
    fig.suptitle("\n".join(t if len(t) < 120 else t[:117] + "..." for t in title.splitlines()), fontsize=10)
    return fig


def _other_scale(values: list[float], reference: list[float], factor: float = 3.0) -> bool:
    """Whether ``values`` would flatten a curve of ``reference`` on one axis: their typical
    magnitudes (medians of |v|) differ more than ``factor`` times.  Nothing to compare: no."""
    if not values or not reference:
        return False
    a = sorted(abs(v) for v in values)[len(values) // 2]
    b = sorted(abs(v) for v in reference)[len(reference) // 2]
    return min(a, b) > 0 and max(a, b) / min(a, b) > factor


def _mark_interruptions(log: ParsedLog, panels: list) -> None:
    """A dotted red line at each preemption's step and a dashed green one where each resume
    continued (trnqwen's own lines), on every panel; labelled once."""
    for p in log.preempted:
        for k, ax in enumerate(panels):
            ax.axvline(p["step"], color="tab:red", ls=":", lw=1.2, label=f"preempted ({p['signal']}) at step {p['step']}" if k == 0 else None)
    for r in log.resumes:
        at = r["from_step"] + 0.5  # the resumed run's first step is from_step + 1
        for k, ax in enumerate(panels):
            ax.axvline(at, color="tab:green", ls="--", lw=1.2, label=f"resumed from step {r['from_step']}" if k == 0 else None)


def save_figure_atomic(fig, path: Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure atomically (:func:`trnqwen.fsutil.write_atomic`: never half a PNG);
    the figure is closed either way."""
    import matplotlib.pyplot as plt

    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi))
    finally:
        plt.close(fig)
