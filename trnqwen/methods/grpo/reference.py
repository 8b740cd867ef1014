"""GRPO's extra log-probs inside torchtitan ranks: the reference's (``--kl-beta``) and the old policy's
(``--num-iterations``), computed once per rollout, as TRL computes them.

No second model is held.  The reference is the run's *starting* weights, swapped into the model's
own parameters for one no-grad forward (:class:`StartingWeights`):

* **full fine-tune**: a CPU copy of each trainable parameter's local shard, taken before step 1
  (1/world of the model per rank); a resumed run reloads it from the starting checkpoint (the HF
  base torchtitan loaded at step 0) through the checkpointer's own load, the trained weights put
  back after;
* **LoRA**: the base with the adapter's contribution off: every ``lora_B`` zeroed for the forward
  (the adapters start at B = 0, so that *is* the starting model, fresh or resumed).

FSDP2 keeps its root's weights gathered after a no-grad forward; every module is resharded before
and after a swap, so the forward gathers the swapped-in shards and the next one the trained ones.
:func:`completion_logps` runs the model as training does (the trainer's own input processing and
context) and scores each completion token with :func:`trnqwen.methods.grpo.loss.token_logps`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Optional

import torch

from trnqwen.methods.grpo.loss import token_logps

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer

IGNORE_INDEX = -100


def _local(param: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of ``param`` (a DTensor's local shard; a plain tensor itself)."""
    return param.to_local() if hasattr(param, "to_local") else param


def reshard(model: torch.nn.Module) -> None:
    """FSDP2: every sharded module back to its shards (the next forward gathers them again)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


class StartingWeights:
    """The starting weights of the parameters training changes, to swap in for the reference (module doc)."""

    def __init__(self, model: torch.nn.Module, params: list[torch.Tensor], starting: list[Optional[torch.Tensor]]):
        self.model = model
        self.params = params
        self.starting = starting  # a CPU copy of each local shard; None: zero (LoRA's B)

    @classmethod
    def capture(cls, model: torch.nn.Module) -> StartingWeights:
        """This rank's starting values, now: LoRA's B matrices (zero), else every trainable parameter."""
        from trnqwen.adapters.lora import titan as lora
        from trnqwen.contract.peft_adapter import is_b_key

        if lora.active():
            params = [p for name, p in model.named_parameters() if is_b_key(name)]
            if not params:
                raise RuntimeError("the GRPO reference found no LoRA B matrix to switch off")
            return cls(model, params, [None] * len(params))
        params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            starting = [_local(p).detach().to("cpu", copy=True) for p in params]
        return cls(model, params, starting)

    @classmethod
    def reload(cls, model: torch.nn.Module, trainer: Trainer) -> StartingWeights:
        """A resumed run's: LoRA as :meth:`capture`; a full fine-tune's from the checkpoint step 0
        loaded (torchtitan's initial load, again), the trained weights put back after."""
        from trnqwen.adapters.lora import titan as lora

        if lora.active():
            return cls.capture(model)
        ck = trainer.checkpointer
        source = ck.initial_load_path or (ck.sd_adapter.hf_assets_path if ck.initial_load_in_hf and ck.sd_adapter else None)
        if not source:
            raise RuntimeError("--kl-beta: a resumed run needs its starting weights for the reference, and this run "
                               "started from a random init (no starting checkpoint to reload)")
        params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            trained = [_local(p).detach().to("cpu", copy=True) for p in params]
            reshard(model)
            ck.dcp_load(ck.states["model"].state_dict(), checkpoint_id=source, from_hf=ck.initial_load_in_hf,
                        from_quantized=ck.initial_load_in_hf_quantized)
            out = cls.capture(model)
            for p, value in zip(params, trained):
                _local(p).copy_(value.to(device=_local(p).device))
            reshard(model)
        return out

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The starting weights in the model for the ``with`` body, the trained ones after."""
        with torch.no_grad():
            reshard(self.model)
            saved = [_local(p).detach().to("cpu", copy=True) for p in self.params]
            try:
                for p, value in zip(self.params, self.starting):
                    local = _local(p)
                    local.zero_() if value is None else local.copy_(value.to(device=local.device))
                yield
            finally:
                reshard(self.model)
                for p, value in zip(self.params, saved):
                    _local(p).copy_(value.to(device=_local(p).device))


def completion_logps(trainer: Trainer, seq: torch.Tensor, targets: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """``[rows, seq_len]`` float32 log-probs of each completion token (0 elsewhere) under the model's
    weights now: the training forward (input processing, context) without a gradient, on CPU."""
    model = trainer.model_parts[0]
    n_rows, seq_len = seq.shape
    input_dict = {"input": seq.to(trainer.device),
                  "positions": torch.arange(seq_len, dtype=torch.long).expand(n_rows, seq_len).contiguous().to(trainer.device)}
    seen = trainer.ntokens_seen
    with torch.no_grad():
        inputs, _, extra = trainer.post_dataloading_process(input_dict, targets.to(trainer.device))
        trainer.ntokens_seen = seen
        with trainer.train_context():
            logits = model(inputs, **extra)
        logps, _ = token_logps(logits, targets.to(logits.device).clamp(min=0), temperature=temperature, entropy=False)
        del logits
    reshard(model)
    return torch.where(targets.to(logps.device) != IGNORE_INDEX, logps, 0.0).cpu()
