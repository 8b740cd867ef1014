"""``--generate``: load the exported model for real and greedily continue a prompt.

The checkpoint folder holds only tensors (torchtitan writes no config or tokenizer), so the model
is built from the config.json verify-ckpt found and the tokenizer comes from the same assets
folder.  On Trainium the model goes to ``device_map="neuron"`` (``"auto"`` does not see Neuron and
silently stays on CPU); ``generate()`` inputs stay on the CPU as the Transformers Neuron notes
advise.  Elsewhere everything runs on the CPU (or CUDA when that is the configured device).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from trnqwen.ckpt.layout import CheckpointFiles, ModelConfig


def device_map_for(device_type: str) -> Optional[str]:
    """``neuron`` -> "neuron", ``cuda`` -> "cuda", anything else -> None (CPU)."""
    return device_type if device_type in ("neuron", "cuda") else None


def detect_device_type(requested: str = "auto") -> str:
    if requested in ("cpu", "neuron", "cuda"):
        return requested
    try:
        from trnqwen.env.device import detect_device

        return detect_device(requested).type
    except Exception:  # no device probe / no devices: CPU is always there
        return "cpu"


def generate(
    ckpt: CheckpointFiles,
    model_config: ModelConfig,
    prompt: str,
    *,
    max_new_tokens: int = 16,
    device: str = "auto",
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Greedy generation; returns ``{"prompt", "completion", "new_tokens", ...}`` or ``{"error"}``."""
    assets = model_config.path.parent
    device_type = detect_device_type(device)
    device_map = device_map_for(device_type)
    try:
        import torch
        from transformers import AutoConfig, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        config = AutoConfig.from_pretrained(str(assets), trust_remote_code=trust_remote_code)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(assets), trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            return {"error": f"no usable tokenizer in {assets} ({str(exc).splitlines()[0]})", "device": device_type}
        started = time.perf_counter()
        model = _load_model(ckpt, config, device_map, trust_remote_code, assets)
        loaded = time.perf_counter()
        inputs = tokenizer(prompt, return_tensors="pt")  # stays on the CPU
        with torch.no_grad():
            output = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            )
        done = time.perf_counter()
        new = output[0, inputs["input_ids"].shape[1]:].tolist()
        return {
            "prompt": prompt,
            "completion": tokenizer.decode(new, skip_special_tokens=True),
            "new_tokens": new,
            "device": device_type,
            "device_map": device_map,
            "load_s": round(loaded - started, 3),
            "generate_s": round(done - loaded, 3),
            "error": None if new else "generated no tokens",
        }
    except Exception as exc:  # a model that does not run is a finding, not a crash
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"error": f"{type(exc).__name__}: {first}", "device": device_type, "device_map": device_map}


def _load_model(ckpt: CheckpointFiles, config, device_map: Optional[str], trust_remote_code: bool, assets: Path):
    """from_pretrained on the export folder (the documented path, device_map included); a lone
    .safetensors file is loaded shard-wise onto a meta-built model instead (no copy held twice).

    The export folder has no config.json or generation_config.json: both come from the assets
    (transformers 5.24 crashes looking for them otherwise)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(str(assets))
    except OSError:
        generation_config = GenerationConfig.from_model_config(config)
    if ckpt.index is not None or [p.name for p in ckpt.files] == ["model.safetensors"]:
        kwargs: dict[str, Any] = {
            "config": config,
            "generation_config": generation_config,
            "trust_remote_code": trust_remote_code,
            "use_safetensors": True,  # never fall back to unpickling a pytorch_model.bin
        }
        if device_map is not None:
            kwargs["device_map"] = device_map
        model = AutoModelForCausalLM.from_pretrained(str(ckpt.root), **kwargs)
    else:
        from safetensors.torch import load_file

        # Built for real (not on meta: non-persistent buffers such as rotary inv_freq must
        # exist), then filled shard by shard: peak memory is the model plus one shard.
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, dtype=config.dtype or torch.float32)
        loaded: set[str] = set()
        for path in ckpt.files:
            shard = load_file(str(Path(path)))
            model.load_state_dict(shard, strict=False)
            loaded.update(shard)
            del shard
        model.tie_weights()
        absent = [k for k in model.state_dict() if k not in loaded and not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if absent:
            raise RuntimeError(f"{len(absent)} weight(s) missing from the checkpoint (e.g. {absent[0]}); cannot run the model")
        model.generation_config = generation_config
        if device_map is not None:
            model = model.to(device_map)
    model.eval()
    return model
