"""The quickstart's judgement of its runs: the recipe's loss check, the loss plot, the summary table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trnqwen.output import number
from trnqwen.quickstart.types import KEEP_FRACTION, MIN_PRETRAIN_DROP, QuickstartResult, RunInfo, StageFailed


def compare_losses(runs: dict[str, RunInfo], pretrain: str = "pretrain") -> dict[str, Any]:
    """The recipe's sanity check: fine-tunes start far below the random-init run's step-1 loss."""
    base = runs[pretrain]
    first, last = base.step1_loss, base.last_loss
    if not (_finite(first) and _finite(last)):
        raise StageFailed("inspect-logs", f"the pre-training run logged no usable loss (step 1: {first}, last: {last})",
                          hint=f"see {base.log}")
    learned = first - last
    if learned < MIN_PRETRAIN_DROP:
        raise StageFailed(
            "inspect-logs",
            f"pre-training did not learn: loss {first:.3f} -> {last:.3f} over {base.steps} steps",
            hint="give it more steps (--pretrain-steps) or check the run's log: " + str(base.log),
        )
    threshold = first - KEEP_FRACTION * learned
    rows = {}
    bad = []
    for label, info in runs.items():
        if label == pretrain:
            continue
        loss = info.step1_loss
        ok = _finite(loss) and loss <= threshold
        rows[label] = {"step1_loss": loss, "below_random_init_by": None if not _finite(loss) else first - loss, "ok": ok}
        if not ok:
            bad.append(f"{label} step-1 loss {loss} is not below {threshold:.3f}")
    result = {
        "random_init_step1_loss": first,
        "pretrain_last_loss": last,
        "threshold": threshold,
        "finetunes": rows,
        "ok": not bad,
    }
    if bad:
        raise StageFailed("inspect-logs", "the pre-trained weights were not loaded: " + "; ".join(bad),
                          hint="compare the runs: trnqwen inspect-logs <pretrain run> --compare <fine-tune run>")
    return result


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def write_loss_plot(runs: dict[str, RunInfo], path: Path) -> Path:
    """Loss against step for every run (random init solid, fine-tunes dashed), written atomically."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    for label, info in runs.items():
        xs = [i + 1 for i, v in enumerate(info.losses) if _finite(v)]
        ys = [v for v in info.losses if _finite(v)]
        if not xs:
            continue
        style = "-" if not info.finetune else "--"
        name = f"{label} ({info.backend}, {'fine-tune' if info.finetune else 'random init'})"
        ax.plot(xs, ys, style, marker="o", ms=3, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("trnqwen quickstart: builtin:tiny-qwen3 on CPU", fontsize=10)
    from trnqwen.logs.plot import save_figure_atomic

    return save_figure_atomic(fig, path)


def _fmt(x: Any) -> str:
    return number(x, ".3f", finite=True)  # quickstart's losses: 3 decimals


SUMMARY_COLUMNS = ("run", "weights", "steps", "ranks", "loss @1", "loss end", "export", "wall")


def summary_rows(result: QuickstartResult) -> list[tuple[str, ...]]:
    """One row per training run, in :data:`SUMMARY_COLUMNS` order."""
    rows = []
    for label, info in result.runs.items():
        v = info.verify
        ck = "verified" if v and v.get("ok") else ("exported" if info.exported else "-")
        rows.append((
            label,
            "trained" if info.finetune else "random",
            str(info.steps),
            str(info.nproc_per_node),
            _fmt(info.step1_loss),
            _fmt(info.last_loss),
            ck,
            f"{info.wall_s:.0f}s" if info.wall_s is not None else "-",
        ))
    return rows


