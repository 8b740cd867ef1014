"""The DPO reference pass inside torchtitan ranks: the starting weights' log-probs, once.

Run by :func:`ensure` right after the checkpoint load and before step 1.  With the reference
already on disk for this key (a rerun, or a resumed run) it is reused; otherwise every data-parallel
rank runs the model (eval mode, no grad, the trainer's own input processing and context) over its
rows of each split, rows ``r, r + W, ...`` in batches of the training batch size, which is exactly
the order of the first training steps, so step 1 sees bit-for-bit the numbers it was compared
with.  Every rank runs the same number of forwards (FSDP gathers in each); the last batch is
filled with rows that hold no pair.  The per-rank results are summed across ranks (each row is
computed by one rank of each data-parallel group) and rank 0 writes them
(:mod:`trnqwen.dataset.reference`).  No second model is ever held: the reference *is* the model,
before its first update.  With LoRA the adapters start at B = 0, so the reference is the base.

A resumed run (step > 0) whose reference is gone cannot be continued exactly: it stops with that
message instead of computing one from weights that have already trained.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from trnqwen.dataset import reference as store
from trnqwen.dataset.cache import open_split
from trnqwen.methods.pairs import batch_from_rows, segment_logps
from trnqwen.runtime.token_stream import RankStream


def _needed(trainer, cache_dir: str) -> dict[str, int]:
    """Rows each split needs: the training prefix the run reads, every validation row."""
    stream = trainer.dataloader.dataset.stream
    per_step = trainer.config.training.local_batch_size * stream.world * trainer.gradient_accumulation_steps
    needed = {"train": store.prefix_rows(stream.n_rows, trainer.config.training.steps, per_step)}
    if trainer.config.validator.enable:
        needed["val"] = len(open_split(cache_dir, "val"))
    return needed


def ensure(trainer) -> None:
    """torchtitan: the reference of ``trainer.loss_fn``'s folder, after the checkpoint load."""
    from torchtitan.tools.logging import logger

    cache_dir = trainer.config.dataloader.cache_dir
    stream = trainer.dataloader.dataset.stream
    model = trainer.model_parts[0]

    def forward(ids: np.ndarray, positions: np.ndarray, markers: np.ndarray):
        seen = trainer.ntokens_seen
        input_dict = {"input": torch.from_numpy(ids).to(trainer.device),
                      "positions": torch.from_numpy(positions).to(trainer.device)}
        inputs, _, extra = trainer.post_dataloading_process(input_dict, torch.from_numpy(markers).to(trainer.device))
        trainer.ntokens_seen = seen
        with trainer.train_context():
            return model(inputs, **extra)

    run_pass(Path(trainer.loss_fn.config.reference_dir), cache_dir, _needed(trainer, cache_dir), model=model,
             forward=forward, rank=stream.rank, world=stream.world, batch_size=trainer.config.training.local_batch_size,
             resumed_at=trainer.step, replicas=_replicas(trainer), log=logger.info,
             settings={"beta": trainer.loss_fn.config.beta, "loss_type": trainer.loss_fn.config.loss_type})


def run_pass(directory: Path, cache_dir: str, needed: dict[str, int], *, model, forward, rank: int, world: int,
             batch_size: int, resumed_at: int, replicas: int = 1, log=print, settings: Optional[dict] = None) -> None:
    """Reuse, extend or compute the reference in ``directory`` (every backend's one path).

    ``forward(ids, positions, markers) -> logits`` runs the model on one batch as training does;
    ``settings`` (beta, loss_type) go on the log line, so the judge knows the expected step-1 loss."""
    import torch.distributed as dist

    from trnqwen.methods.dpo.log_lines import reference_line

    distributed = dist.is_available() and dist.is_initialized()
    if store.is_complete(directory, needed):
        log(reference_line("reused", f"(key {directory.name[:12]}, {directory})", **(settings or {})))
        return
    if resumed_at > 0:
        raise RuntimeError(
            f"this run resumes at step {resumed_at}, but the reference log-probs it needs are not in {directory} "
            f"(rows needed {needed}, present {store.computed_rows(directory)}): they cannot be computed from weights "
            "that have already trained; resume with the --steps it started with, or start the run over"
        )
    started = time.perf_counter()
    have = store.computed_rows(directory)
    arrays, computed = {}, {}
    for name, rows in needed.items():
        split = open_split(cache_dir, name)
        first = min(have.get(name, 0), rows)
        if first >= rows:  # this split's rows are all there already
            arrays[name], computed[name] = np.array(store.open_reference(directory, name)), have[name]
            continue
        array = _compute(model, forward, split, rank, world, batch_size, first, rows)
        if distributed:  # each row came from one rank per dp group; NCCL/Neuron collectives want device tensors
            tensor = torch.from_numpy(array).to(_collective_device(model))
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            array = tensor.cpu().numpy() / replicas
        if first:  # extend the earlier prefix: its rows stay exactly as they were
            array[:first] = store.open_reference(directory, name)[:first]
        array[rows:] = np.nan
        arrays[name], computed[name] = array, rows
    for name in set(have) - set(needed):  # a split this run does not read stays as it was
        arrays[name], computed[name] = np.array(store.open_reference(directory, name)), have[name]
    seconds = time.perf_counter() - started
    if not distributed or dist.get_rank() == 0:
        store.write_reference(directory, arrays, computed, {"seconds": round(seconds, 3)})
    if distributed:
        dist.barrier()
    done = ", ".join(f"{rows - min(have.get(name, 0), rows)} {name}" for name, rows in needed.items())
    log(reference_line("computed", f"for {done} rows in {seconds:.1f} s (key {directory.name[:12]}, {directory})",
                       **(settings or {})))


def _collective_device(model) -> torch.device:
    """The device the process group reduces on: the model's (gloo on CPU reduces CPU tensors)."""
    param = next(model.parameters(), None)
    device = getattr(param, "device", torch.device("cpu"))
    return torch.device("cpu") if device.type == "meta" else device


def _replicas(trainer) -> int:
    """Ranks that computed each row (the non-data-parallel degree: tp, cp...)."""
    return int(getattr(trainer.parallel_dims, "non_data_parallel_size", 1) or 1)


def _compute(model, forward, split, rank: int, world: int, batch_size: int, first: int, rows_needed: int) -> np.ndarray:
    """This rank's rows among ``first .. rows_needed - 1`` (zeros elsewhere), in the training order."""
    pairs_per_row = int(split.meta["pairs_per_row"][split.name])
    out = np.zeros((len(split), pairs_per_row, 2), dtype=np.float32)
    stream = RankStream(max(1, rows_needed), rank=rank, world=world, infinite=False, batch_size=batch_size)
    # rows below ``first`` were computed by an earlier run: skip whole batches of them (every rank the same)
    stream.rows_read = (first // world) // batch_size * batch_size
    was_training = model.training
    model.eval()  # dropout off: the reference is the deterministic model
    try:
        with torch.no_grad():
            while not stream.exhausted():
                rows = [stream.advance() for _ in range(batch_size)]
                ids, positions, targets, segments, _, markers = batch_from_rows(split, rows, None, pairs_per_row)
                pred = forward(ids, positions, markers)
                sums, _ = segment_logps(pred, torch.from_numpy(targets).to(pred.device),
                                        torch.from_numpy(segments).to(pred.device), pairs_per_row)
                sums = sums.float().cpu().numpy()
                for i, row in enumerate(rows):
                    if row is not None and row >= first:
                        out[row] = sums[i]
    finally:
        model.train(was_training)
    return out
