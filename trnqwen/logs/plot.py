"""``--plot FILE.png``: loss, grad norm, throughput/MFU and (when logged) the learning rate against
step (matplotlib, Agg); a DPO run adds a panel of its ``[DPO]`` values: rewards chosen/rejected and
margin, accuracy on a second axis."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Optional

from trnqwen.fsutil import current_umask
from trnqwen.logs.record import ParsedLog


def _dpo_series(log: ParsedLog, key: str, *, validation: bool = False) -> tuple[list[int], list[float]]:
    """A ``[DPO]`` value by step (``validation``: of the validations)."""
    recs = ([(v["step"], v) for v in log.validations] if validation
            else sorted(log.dpo_steps.items()))
    pts = [(step, float(rec[key])) for step, rec in recs
           if isinstance(rec.get(key), (int, float)) and math.isfinite(rec[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _plot_dpo(ax, run: ParsedLog, style: str, suffix: str) -> None:
    """Rewards chosen/rejected and margin on ``ax``, accuracy on its twin (``ax.acc``)."""
    for key, color, label in (("rewards_chosen", "tab:green", "rewards chosen"),
                              ("rewards_rejected", "tab:red", "rewards rejected"), ("margin", "tab:blue", "margin")):
        x, y = _dpo_series(run, key)
        ax.plot(x, y, style, marker="o" if len(x) <= 50 else None, ms=3, color=color, label=f"{label}{suffix}")
    x, y = _dpo_series(run, "margin", validation=True)
    if x:
        ax.plot(x, y, style, marker="s", ms=4, color="tab:cyan", label=f"validation margin{suffix}")
    x, y = _dpo_series(run, "accuracy")
    ax.acc.plot(x, y, style, color="tab:grey", alpha=0.7, label=f"accuracy{suffix}")
    x, y = _dpo_series(run, "accuracy", validation=True)
    if x:
        ax.acc.plot(x, y, style, marker="s", ms=4, color="black", alpha=0.7, label=f"validation accuracy{suffix}")


def _series(log: ParsedLog, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for s in log.step_list():
        v = s.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(s["step"])
            ys.append(float(v))
    return xs, ys


def write_plot(log: ParsedLog, path: Path, *, other: Optional[ParsedLog] = None, title: Optional[str] = None,
               evaluations: Optional[list[dict]] = None) -> None:
    """Three stacked panels sharing the step axis; step 1 (compilation) is marked on the
    throughput panel.  With ``other``, both runs are drawn (A solid, B dashed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = [("A" if other is not None else None, log, "-")]
    if other is not None:
        runs.append(("B", other, "--"))
    with_lr = any(_series(run, "lr")[0] for _, run, _ in runs)
    with_dpo = any(run.dpo_steps for _, run, _ in runs)
    panels = 3 + with_lr + with_dpo
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3 + 2 * panels), sharex=True, constrained_layout=True)
    ax_loss, ax_grad, ax_tps = axes[:3]
    ax_lr = axes[3] if with_lr else None
    ax_dpo = axes[-1] if with_dpo else None
    if ax_dpo is not None:
        ax_dpo.acc = ax_dpo.twinx()
    ax_mfu = ax_tps.twinx()
    for label, run, style in runs:
        suffix = f" ({label})" if label else ""
        x, y = _series(run, "loss")
        ax_loss.plot(x, y, style, marker="o" if len(x) <= 50 else None, ms=3, color="tab:blue", label=f"loss{suffix}")
        vx = [v["step"] for v in run.validations if isinstance(v.get("loss"), float) and math.isfinite(v["loss"])]
        vy = [v["loss"] for v in run.validations if isinstance(v.get("loss"), float) and math.isfinite(v["loss"])]
        if vx:
            ax_loss.plot(vx, vy, style, marker="s", ms=4, color="tab:green", label=f"validation loss{suffix}")
        x, y = _series(run, "grad_norm")
        ax_grad.plot(x, y, style, marker="o" if len(x) <= 50 else None, ms=3, color="tab:orange", label=f"grad norm{suffix}")
        x, y = _series(run, "tps")
        ax_tps.plot(x, y, style, marker="o" if len(x) <= 50 else None, ms=3, color="tab:purple", label=f"tokens/s/device{suffix}")
        x, y = _series(run, "mfu")
        if x:
            ax_mfu.plot(x, y, style, color="tab:red", alpha=0.7, label=f"MFU %{suffix}")
        x, y = _series(run, "lr")
        if ax_lr is not None and x:
            ax_lr.plot(x, y, style, marker="o" if len(x) <= 50 else None, ms=3, color="tab:brown", label=f"learning rate{suffix}")
        if ax_dpo is not None and run.dpo_steps:
            _plot_dpo(ax_dpo, run, style, suffix)
    # trnqwen eval's held-out losses (eval.json): the base before step 1, the export at its step
    for n, ev in enumerate(evaluations or []):
        for r in (ev or {}).get("results", []):
            if isinstance(r.get("loss"), (int, float)) and isinstance(ev.get("step"), int):
                base = r.get("checkpoint") == "base"
                tag = f" ({'AB'[n]})" if other is not None else ""
                ax_loss.plot([0 if base else ev["step"]], [r["loss"]], "x" if base else "*", ms=9,
                             label=f"held-out {'base' if base else r['checkpoint']}{tag}")
    # Non-finite losses: mark where they happened.
    bad = [s["step"] for s in log.step_list() if isinstance(s.get("loss"), float) and not math.isfinite(s["loss"])]
    for st in bad[:50]:
        ax_loss.axvline(st, color="red", alpha=0.3, lw=1)
    if bad:
        ax_loss.plot([], [], color="red", alpha=0.5, label="NaN/Inf loss")
    if any(s["step"] == 1 for s in log.step_list()):
        ax_tps.axvspan(0.5, 1.5, color="grey", alpha=0.15, label="step 1 (compilation)")
    ax_loss.set_ylabel("loss")
    ax_grad.set_ylabel("grad norm")
    ax_tps.set_ylabel("tokens / s / device")
    ax_mfu.set_ylabel("MFU (%)")
    if ax_mfu.lines:
        ax_mfu.set_ylim(bottom=0)  # an honest scale: a 0.1-point wobble should look like one
    bottom = axes[-1]
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax_lr is not None:
        ax_lr.set_ylabel("learning rate")
        ax_lr.legend(loc="upper right", fontsize=8)
    if ax_dpo is not None:
        ax_dpo.set_ylabel("DPO rewards / margin")
        ax_dpo.acc.set_ylabel("DPO accuracy")
        ax_dpo.acc.set_ylim(-0.05, 1.05)
        ax_dpo.axhline(0.0, color="grey", lw=0.8, alpha=0.5)
        h1, l1 = ax_dpo.get_legend_handles_labels()
        h2, l2 = ax_dpo.acc.get_legend_handles_labels()
        ax_dpo.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    for ax in (ax_loss, ax_grad, ax_tps, *(a for a in (ax_lr, ax_dpo) if a is not None)):
        ax.grid(True, alpha=0.3)
    ax_loss.legend(loc="upper right", fontsize=8)
    ax_grad.legend(loc="upper right", fontsize=8)
    handles, labels = ax_tps.get_legend_handles_labels()
    h2, l2 = ax_mfu.get_legend_handles_labels()
    ax_tps.legend(handles + h2, labels + l2, loc="lower right", fontsize=8)
    name = title or (log.source if other is None else f"A: {log.source}\nB: {other.source}")
    fig.suptitle(name if len(name) < 120 else "..." + name[-117:], fontsize=10)
    path = Path(path)
    save_figure_atomic(fig, path)


def save_figure_atomic(fig, path: Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure to a temp file beside ``path`` and rename it (never half a PNG),
    with the user's umask; the figure is closed either way."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix or ".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path
