"""DPO on the hf-trainer backend: the same rows, reference pass and loss as the torchtitan ranks.

Every preference method's Trainer part (the pair rows, the loss over ``num_items_in_batch`` pairs,
the validation, the values in the Trainer's logs) is :mod:`trnqwen.methods.pair_hf_trainer`'s.
DPO's own:

* the rows carry each pair's reference log-probs (``<cache>/reference/<key>``, read when the rows
  are; a row without them stops the run naming it);
* :func:`reference_pass` runs :func:`trnqwen.methods.dpo.reference_pass.run_pass` with the loaded
  model (LoRA attached, B = 0) before ``trainer.train``;
* the loss is :func:`trnqwen.methods.dpo.loss.pair_terms`, the line after each step ``[DPO]``.

:class:`DPOHooks` is what ``runtime/hf_trainer.py`` loads from the spec's ``method_hooks``
(``trnqwen.methods.dpo.hf_trainer:DPOHooks``), built with the plan's settings (beta, loss_type,
reference_dir).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from trnqwen.contract.hf_trainer_spec import HFTrainerSpec
from trnqwen.dataset import reference as store
from trnqwen.methods.dpo import loss as arith
from trnqwen.methods.dpo.log_lines import format_line
from trnqwen.methods.pair_hf_trainer import PairHooks


def reference_pass(spec: HFTrainerSpec, model, *, rank: int, world: int, replicas: int, grad_accum: int, resumed_at: int,
                   log: Callable[[str], None], reference_dir: str, beta: float, loss_type: str) -> None:
    from trnqwen.dataset.cache import open_split
    from trnqwen.methods.dpo.reference_pass import run_pass

    train_rows = len(open_split(spec.cache_dir, "train"))
    needed = {"train": store.prefix_rows(train_rows, spec.steps, spec.local_batch_size * world * grad_accum)}
    if spec.val_every:
        needed["val"] = len(open_split(spec.cache_dir, "val"))
    device = next(model.parameters()).device

    def forward(ids, positions, markers):
        return model(input_ids=torch.from_numpy(ids).to(device), position_ids=torch.from_numpy(positions).to(device),
                     use_cache=False).logits

    run_pass(Path(reference_dir), spec.cache_dir, needed, model=model, forward=forward, rank=rank, world=world,
             batch_size=spec.local_batch_size, resumed_at=resumed_at, replicas=replicas, log=log,
             settings={"beta": beta, "loss_type": loss_type})


class DPOHooks(PairHooks):
    """The hf-trainer ranks' entry points for DPO (:class:`~trnqwen.methods.pair_hf_trainer.PairHooks`
    with the reference log-probs: in the rows, and computed before step 1)."""

    METHOD = "dpo"
    ARITH = arith
    format_line = staticmethod(format_line)

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(settings)
        self.beta = float(settings["beta"])
        self.loss_type = str(settings["loss_type"])
        self.reference_dir = str(settings["reference_dir"])

    def terms(self):
        return arith.terms_fn(beta=self.beta, loss_type=self.loss_type)

    def row_settings(self) -> dict[str, Any]:
        return {"stored": lambda split: store.open_reference(self.reference_dir, split),
                "missing": arith.missing_reference(self.reference_dir)}

    def before_train(self, spec: HFTrainerSpec, model, *, rank: int, world: int, replicas: int, grad_accum: int,
                     resumed_at: int, log: Callable[[str], None]) -> None:
        """The reference log-probs of these starting weights, before step 1."""
        reference_pass(spec, model, rank=rank, world=world, replicas=replicas, grad_accum=grad_accum,
                       resumed_at=resumed_at, log=log, reference_dir=self.reference_dir, beta=self.beta,
                       loss_type=self.loss_type)
