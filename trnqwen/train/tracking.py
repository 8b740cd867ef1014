"""``--tensorboard`` / ``--wandb``: metrics where users already look, written by the trainers' own
writers, never by a tracking dependency trnqwen itself requires.

* torchtitan backends: ``config.metrics.enable_tensorboard`` / ``enable_wandb`` in the generated
  config module.  torchtitan writes under ``<dump_folder>/tb/<timestamp>/`` (the dump folder is
  the run dir), validation included (its validator logs through the same writer).
* hf-trainer: ``TrainingArguments(report_to=[...])`` with ``TENSORBOARD_LOGGING_DIR=<run dir>/tb``.
* ``--wandb`` needs ``wandb`` installed and configured (``wandb login``, ``WANDB_API_KEY``, or
  ``WANDB_MODE=offline``); otherwise the run stops before it starts with one line saying so.
  W&B's project defaults to ``trnqwen`` and the run's name to the run id.
``trnqwen eval`` adds its results to the same events (:func:`log_eval`).  No torch at import.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Optional

from trnqwen.config import RunConfig
from trnqwen.errors import EnvironmentProblem

TB_FOLDER = "tb"


def wandb_problem(environ: Optional[dict[str, str]] = None) -> Optional[str]:
    """Why ``--wandb`` cannot work here, or None.  Never reads or prints the key itself."""
    env = os.environ if environ is None else environ
    if importlib.util.find_spec("wandb") is None:
        return "--wandb: the wandb package is not installed (pip install wandb)"
    if env.get("WANDB_API_KEY") or env.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return None
    try:
        import netrc

        if netrc.netrc().authenticators("api.wandb.ai"):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return "--wandb: wandb is not logged in (run `wandb login`, set WANDB_API_KEY, or WANDB_MODE=offline)"


def check(cfg: RunConfig, *, check_runtime: bool = True) -> list[str]:
    """Raise (a real run) or return notes (dry run) when the requested tracking cannot work."""
    if not getattr(cfg, "wandb", False):
        return []
    problem = wandb_problem()
    if problem is None:
        return []
    if check_runtime:
        raise EnvironmentProblem(problem, hint="or drop --wandb (--tensorboard needs no account)")
    return [problem]


def titan_lines(cfg: RunConfig) -> list[str]:
    """Lines of the torchtitan config module that turn its own metric writers on."""
    lines = []
    if getattr(cfg, "tensorboard", False):
        lines += ["config.metrics.enable_tensorboard = True", f"config.metrics.save_tb_folder = {TB_FOLDER!r}"]
    if getattr(cfg, "wandb", False):
        lines.append("config.metrics.enable_wandb = True")
    return lines


def report_to(cfg: RunConfig) -> list[str]:
    """The Trainer's ``report_to`` (empty: none)."""
    return [name for name, on in (("tensorboard", getattr(cfg, "tensorboard", False)), ("wandb", getattr(cfg, "wandb", False))) if on]


def rank_env(cfg: RunConfig, run_dir: Optional[Path]) -> dict[str, str]:
    """Environment for the ranks' writers (only what the user did not set already)."""
    env: dict[str, str] = {}
    if run_dir is None:
        return env
    if getattr(cfg, "tensorboard", False):
        env["TENSORBOARD_LOGGING_DIR"] = str(Path(run_dir) / TB_FOLDER)
    if getattr(cfg, "wandb", False):
        # the run id is also W&B's run id, so `trnqwen eval` can add its results to the same run
        env.update({"WANDB_PROJECT": "trnqwen", "WANDB_RUN_NAME": Path(run_dir).name, "WANDB_RUN_ID": Path(run_dir).name,
                    "WANDB_DIR": str(run_dir)})
    return {k: v for k, v in env.items() if k not in os.environ}


PREFERENCE_SCALARS = ("preference_accuracy", "margin", "reward_accuracy", "reward_margin",
                      "mean_reward", "pass_at_1")  # a method's own held-out numbers (pairs; GRPO's prompts)


def log_eval(run_dir: Path, results: list[dict[str, Any]], step: Optional[int]) -> Optional[Path]:
    """Eval losses as TensorBoard scalars beside the run's training events (``eval/<checkpoint>/loss``),
    when the run wrote TensorBoard events and tensorboard is installed; the folder, or None."""
    tb = Path(run_dir) / TB_FOLDER
    if not tb.is_dir() or importlib.util.find_spec("tensorboard") is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    folder = tb / "eval"
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for r in results:
            name = str(r["checkpoint"]).replace("/", "_")
            if r.get("loss") is not None:  # held-out prompts have no loss
                writer.add_scalar(f"eval/{name}/loss", r["loss"], global_step=step or 0)
            if r.get("perplexity") is not None:
                writer.add_scalar(f"eval/{name}/perplexity", r["perplexity"], global_step=step or 0)
            for field in PREFERENCE_SCALARS:  # a preference method's held-out pairs
                if r.get(field) is not None:
                    writer.add_scalar(f"eval/{name}/{field}", r[field], global_step=step or 0)
    finally:
        writer.close()
    return folder


def log_eval_wandb(run_dir: Path, run_config: dict[str, Any], results: list[dict[str, Any]], step: Optional[int]) -> bool:
    """Eval losses into the run's own W&B run (resumed by its id), when it trained with --wandb and
    wandb still works here; whether it logged."""
    if not run_config.get("wandb") or wandb_problem() is not None:
        return False
    import wandb

    run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "trnqwen"), id=os.environ.get("WANDB_RUN_ID", Path(run_dir).name),
        resume="allow", dir=str(run_dir), settings=wandb.Settings(silent=True),
    )
    try:
        metrics: dict[str, Any] = {f"eval/{str(r['checkpoint']).replace('/', '_')}/loss": r["loss"] for r in results
                                   if r.get("loss") is not None}
        metrics.update({f"eval/{str(r['checkpoint']).replace('/', '_')}/{field}": r[field]
                        for r in results for field in PREFERENCE_SCALARS if r.get(field) is not None})
        if step is not None:  # W&B steps only grow: the training step it belongs to goes in as a value
            metrics["eval/train_step"] = step
        run.log(metrics)
    finally:
        run.finish()
    return True
