"""One model in memory at a time: load in the checkpoint's dtype, score, answer, free.

Scoring follows training exactly: the cache's labels are already shifted (the target of input
position t), packed documents attend only within themselves (transformers builds a block-causal
mask from per-document ``position_ids`` when no attention mask is given), and the loss is the sum
of token cross-entropies over trained labels divided by their count (token-weighted).

Shapes never change: every batch is ``[batch_size, seq_len]`` (the last one filled with rows that
train nothing) and every generation batch is left-padded to one prompt length, so Neuron compiles
once.  On CPU/CUDA only the trained positions go through the LM head (it is a vocab-wide matmul,
and chat data trains a fraction of the tokens); on Neuron the full head runs to keep shapes fixed.

Neuron follows the Transformers Neuron rules: ``device_map="neuron"`` (never "auto", which does
not see Neuron), ``generate()`` inputs left on the CPU, ``cache_implementation="static"``.
torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from typing import Any, Optional

from trnqwen.evaluate.data import IGNORE_INDEX, Conversation, EvalData
from trnqwen.evaluate.targets import EvalTarget

HEAD_CHUNK = 4096  # trained positions per LM-head + cross-entropy chunk (bounds the logits' memory)


@dataclass
class LossResult:
    tokens: int
    loss_sum: float

    @property
    def loss(self) -> float:
        return self.loss_sum / self.tokens if self.tokens else float("nan")

    @property
    def perplexity(self) -> float:
        try:
            return math.exp(self.loss)
        except OverflowError:
            return float("inf")


def device_map_for(device_type: str) -> Optional[str]:
    return device_type if device_type in ("neuron", "cuda") else None


def weights_dtype(target: EvalTarget) -> str:
    """The dtype the weights were saved in (safetensors headers), else config.json's."""
    from trnqwen.ckpt.model_folder import weights_dtype as saved_dtype

    return saved_dtype(target.folder) or str(target.config.get("dtype") or target.config.get("torch_dtype") or "float32")


def load_model(target: EvalTarget, device_type: str, *, trust_remote_code: bool = False):
    """``from_pretrained`` of the model folder in its own dtype, on the device, in eval mode.

    A folder written before exports were complete has no config.json: the config and
    generation config then come from the assets that describe it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs: dict[str, Any] = {
        "dtype": getattr(torch, weights_dtype(target)),
        "use_safetensors": True,  # never fall back to unpickling a pytorch_model.bin
        "trust_remote_code": trust_remote_code,
    }
    device_map = device_map_for(device_type)
    if device_map is not None:
        kwargs["device_map"] = device_map
    if target.config_dir != target.folder:
        kwargs["config"] = AutoConfig.from_pretrained(str(target.config_dir), trust_remote_code=trust_remote_code)
        try:
            kwargs["generation_config"] = GenerationConfig.from_pretrained(str(target.config_dir))
        except OSError:
            kwargs["generation_config"] = GenerationConfig.from_model_config(kwargs["config"])
    model = AutoModelForCausalLM.from_pretrained(str(target.folder), **kwargs)
    if target.adapter is not None:
        model = with_adapter(model, target.adapter)
    model.eval()
    return model


def with_adapter(model, folder):
    """``model`` with the PEFT LoRA adapter in ``folder`` loaded by peft itself, unmerged (base +
    adapter, as peft and vLLM serve it); :class:`CheckFailed` when peft cannot place every key
    (it loads with ``strict=False``: a wrong name would only warn, and eval would score the base)."""
    import warnings

    from peft import PeftModel

    from trnqwen.ckpt.verify_adapter import adapter_key_diff
    from trnqwen.errors import CheckFailed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's strict=False warnings: checked below instead
        wrapped = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    missing, unexpected = adapter_key_diff(wrapped, folder)
    if missing or unexpected:
        raise CheckFailed(
            f"the LoRA adapter {folder} does not load onto its base: {len(missing)} missing, {len(unexpected)} unexpected "
            f"adapter key(s), e.g. {(missing + unexpected)[0]}",
            hint=f"trnqwen verify-ckpt {folder} says what is wrong",
        )
    return wrapped


def release_memory() -> None:
    """After the caller dropped its last reference to a model: collect it (modules hold reference
    cycles) and hand cached device memory back, so the next model loads into that memory."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _batch(data: EvalData, start: int, batch_size: int):
    """Rows [start, start + batch_size) as int64 tensors, filled up with untrained pad rows."""
    import numpy as np
    import torch

    stop = min(start + batch_size, len(data))
    n, seq_len = stop - start, data.seq_len
    ids = np.full((batch_size, seq_len), data.pad_id, dtype=np.int64)
    labels = np.full((batch_size, seq_len), IGNORE_INDEX, dtype=np.int64)
    positions = np.broadcast_to(np.arange(seq_len, dtype=np.int64), (batch_size, seq_len)).copy()
    ids[:n] = data.input_ids[start:stop]
    labels[:n] = data.labels[start:stop]
    positions[:n] = data.positions[start:stop]
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(positions)


def score(model, data: EvalData, *, batch_size: int, static_shapes: bool = False, progress=None) -> LossResult:
    """Token-weighted cross-entropy over every trained label of ``data``."""
    import torch
    import torch.nn.functional as F

    device = model.device
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    tokens, loss_sum = 0, 0.0
    with torch.inference_mode():
        for start in range(0, len(data), batch_size):
            ids, labels, positions = (t.to(device) for t in _batch(data, start, batch_size))
            hidden = decoder(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
            if static_shapes:
                logits = head(hidden).float()
                loss_sum += float(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"))
                tokens += int((labels != IGNORE_INDEX).sum())
            else:
                keep = labels != IGNORE_INDEX
                picked, targets = hidden[keep], labels[keep]
                for lo in range(0, targets.numel(), HEAD_CHUNK):
                    logits = head(picked[lo:lo + HEAD_CHUNK]).float()
                    loss_sum += float(F.cross_entropy(logits, targets[lo:lo + HEAD_CHUNK], reduction="sum"))
                tokens += int(targets.numel())
            if progress is not None:
                progress(min(start + batch_size, len(data)), len(data))
    return LossResult(tokens=tokens, loss_sum=loss_sum)


def prompt_length(conversations: list[Conversation], multiple: int = 64) -> int:
    """One padded prompt length for every model and batch (a multiple of ``multiple``)."""
    longest = max(len(c.prompt_ids) for c in conversations)
    return -(-longest // multiple) * multiple


def answer(
    model,
    conversations: list[Conversation],
    *,
    pad_id: int,
    eos_ids: list[int],
    prompt_len: int,
    max_new_tokens: int,
    batch_size: int,
    device_type: str,
) -> list[list[int]]:
    """Greedy answers (token ids, cut at the first end-of-turn) to each conversation's prompt.

    Prompts are left-padded to ``prompt_len`` and batches filled to ``batch_size``, so every
    call has one shape.  Inputs stay on the CPU (generate moves them; the Neuron rule).
    """
    import torch

    out: list[list[int]] = []
    options: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": False,
        "temperature": None,
        "top_p": None,
        "top_k": None,
        "pad_token_id": pad_id,
        "eos_token_id": eos_ids,
    }
    if device_type == "neuron":
        options["cache_implementation"] = "static"
    for start in range(0, len(conversations), batch_size):
        chunk = conversations[start:start + batch_size]
        ids = torch.full((batch_size, prompt_len), pad_id, dtype=torch.long)
        mask = torch.zeros((batch_size, prompt_len), dtype=torch.long)
        for i in range(batch_size):
            prompt = (chunk[i] if i < len(chunk) else chunk[0]).prompt_ids[-prompt_len:]
            ids[i, prompt_len - len(prompt):] = torch.tensor(prompt)
            mask[i, prompt_len - len(prompt):] = 1
        with torch.inference_mode():
            generated = model.generate(input_ids=ids, attention_mask=mask, **options)
        for row in generated[: len(chunk), prompt_len:].tolist():
            cut = next((i for i, t in enumerate(row) if t in eos_ids), len(row))
            out.append(row[:cut])
    return out


def eos_ids_of(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    found = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in found:
        found.append(tokenizer.eos_token_id)
    return found
