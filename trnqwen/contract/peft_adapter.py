"""The LoRA adapter's checkpoint form: a PEFT adapter folder, and merging it into its base.

A folder that ``peft.PeftModel.from_pretrained(base, folder)``, transformers' PEFT integration and
vLLM (``--enable-lora``) load as they are:

  adapter_config.json        peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
                             task_type CAUSAL_LM, base_model_name_or_path, ... (written last)
  adapter_model.safetensors  ``base_model.model.<HF module path>.lora_A.weight`` [r, in] and
                             ``...lora_B.weight`` [out, r], in the base checkpoint's dtype

Names are mapped from each backend's modules here (:func:`hf_module_of_titan`); a fused ``wqkv``
adapter (torchtitan-neuron's models) is split exactly: A is shared, so q, k and v each get a copy;
B's rows follow torchtitan's fused layout ``[n_kv, heads_per_kv + 2, head_dim]`` (q heads of the
group, then k, then v), the same split torchtitan applies to the base ``wqkv`` on save.

The adapter init lives here too (:func:`adapter_init`), so every backend draws the same A for
the same seed and module name.  torch is imported inside functions: the launcher reads adapter
configs and verifies folders without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from trnqwen.contract.lora import LoraSpec
from trnqwen.fsutil import current_umask

# An adapter's parameters in a model's state dict: torchtitan's lora_a/lora_b, peft's (and
# trnqwen's hf-v5 LoraLinear's) lora_A/lora_B.
ADAPTER_KEY = re.compile(r"(^|\.)(lora_a|lora_b|lora_A|lora_B)(\.|$)")
B_KEY = re.compile(r"(^|\.)(lora_b|lora_B)(\.|$)")
PEFT_PREFIX = "base_model.model."
PEFT_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.default)?\.weight$")

# torchtitan Qwen3 module FQNs -> Hugging Face module paths (the state-dict adapter's table).
_TITAN_TO_HF = [
    (re.compile(r"^layers\.(\d+)\.attention\.qkv_linear\.wq$"), r"model.layers.\1.self_attn.q_proj"),
    (re.compile(r"^layers\.(\d+)\.attention\.qkv_linear\.wk$"), r"model.layers.\1.self_attn.k_proj"),
    (re.compile(r"^layers\.(\d+)\.attention\.qkv_linear\.wv$"), r"model.layers.\1.self_attn.v_proj"),
    (re.compile(r"^layers\.(\d+)\.attention\.qkv_linear\.wqkv$"), r"model.layers.\1.self_attn.qkv_proj"),
    (re.compile(r"^layers\.(\d+)\.attention\.wo$"), r"model.layers.\1.self_attn.o_proj"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.w1$"), r"model.layers.\1.mlp.gate_proj"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.w3$"), r"model.layers.\1.mlp.up_proj"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.w2$"), r"model.layers.\1.mlp.down_proj"),
]
# Wrappers that appear in module paths after activation checkpointing / compile / FSDP.
_WRAPPERS = re.compile(r"(^|\.)(_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)(?=\.|$)")
FUSED_QKV = ".self_attn.qkv_proj"


def is_adapter_key(name: str) -> bool:
    return ADAPTER_KEY.search(name) is not None


def is_b_key(name: str) -> bool:
    """An adapter's B matrix (zero at the start: with every B zeroed the model is its base)."""
    return B_KEY.search(name) is not None


def clean_fqn(fqn: str) -> str:
    return _WRAPPERS.sub("", fqn).lstrip(".")


def hf_module_of_titan(fqn: str) -> str:
    """``layers.3.attention.qkv_linear.wq`` -> ``model.layers.3.self_attn.q_proj``."""
    fqn = clean_fqn(fqn)
    for pattern, replacement in _TITAN_TO_HF:
        if pattern.match(fqn):
            return pattern.sub(replacement, fqn)
    raise ValueError(f"no Hugging Face module for torchtitan module {fqn!r}: LoRA adapts attention and MLP projections only")


def adapter_init(seed: int, module: str, shape: tuple[int, int]):
    """A's initial values for ``module`` (an HF module path): kaiming-uniform(a=sqrt(5)), i.e.
    U(-1/sqrt(in), 1/sqrt(in)) as peft and torchtitan draw it, from a generator seeded by
    (seed, module name) so every backend, rank count and order of construction agrees."""
    import torch

    digest = hashlib.sha256(f"{seed}:{clean_fqn(module)}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF)
    bound = 1.0 / float(shape[1]) ** 0.5
    return (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1).mul_(bound).to(torch.float32)


def split_fused_qkv(a: Any, b: Any, *, n_heads: int, n_kv_heads: int, head_dim: int) -> dict[str, tuple[Any, Any]]:
    """A fused-wqkv adapter as exact q/k/v adapters: A copied, B's rows de-interleaved."""
    rank = b.shape[1]
    per_kv = n_heads // n_kv_heads
    grouped = b.reshape(n_kv_heads, per_kv + 2, head_dim, rank)
    q = grouped[:, :per_kv].reshape(n_heads * head_dim, rank)
    k = grouped[:, per_kv].reshape(n_kv_heads * head_dim, rank)
    v = grouped[:, per_kv + 1].reshape(n_kv_heads * head_dim, rank)
    return {"q_proj": (a.clone(), q.clone()), "k_proj": (a.clone(), k.clone()), "v_proj": (a.clone(), v.clone())}


def peft_tensors(modules: dict[str, tuple[Any, Any]], *, fused_dims: Optional[tuple[int, int, int]] = None) -> dict[str, Any]:
    """{HF module path: (A, B)} -> PEFT's flat key -> tensor mapping (fused q/k/v split)."""
    out: dict[str, Any] = {}
    for path in sorted(modules):
        a, b = modules[path]
        if path.endswith(FUSED_QKV):
            if fused_dims is None:
                raise ValueError(f"{path}: a fused q/k/v adapter needs the head layout to be split")
            n_heads, n_kv, head_dim = fused_dims
            prefix = path[: -len("qkv_proj")]
            for proj, (pa, pb) in split_fused_qkv(a, b, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim).items():
                out[f"{PEFT_PREFIX}{prefix}{proj}.lora_A.weight"] = pa.contiguous()
                out[f"{PEFT_PREFIX}{prefix}{proj}.lora_B.weight"] = pb.contiguous()
            continue
        out[f"{PEFT_PREFIX}{path}.lora_A.weight"] = a.contiguous()
        out[f"{PEFT_PREFIX}{path}.lora_B.weight"] = b.contiguous()
    return out


def adapter_config(spec: LoraSpec, target_modules: list[str]) -> dict[str, Any]:
    """peft's LoraConfig fields for ``spec`` (a :class:`trnqwen.contract.lora.LoraSpec`)."""
    base = str(spec.base_model)
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": int(spec.rank),
        "lora_alpha": float(spec.alpha),
        "lora_dropout": float(spec.dropout),
        "target_modules": sorted(target_modules),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "base_model_name_or_path": base.split(":", 1)[1] if base.startswith("builtin:") else base,
        "revision": None,
    }


def write_adapter(folder: str | Path, modules: dict[str, tuple[Any, Any]], spec: LoraSpec, *,
                  fused_dims: Optional[tuple[int, int, int]] = None, dtype: Optional[str] = None) -> list[str]:
    """Write the PEFT adapter folder; adapter_config.json last, so its presence means complete.

    ``dtype``: the base checkpoint's (``bfloat16`` for the published Qwen3), as every export keeps
    it; peft upcasts bf16/fp16 adapters to float32 when it loads them.  None keeps the tensors'."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = peft_tensors(modules, fused_dims=fused_dims)
    if dtype is not None:
        tensors = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in tensors.items()}
    targets = sorted({PEFT_KEY.match(k).group("module").rsplit(".", 1)[-1] for k in tensors})  # type: ignore[union-attr]
    _atomic(folder / ADAPTER_WEIGHTS, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    text = json.dumps(adapter_config(spec, targets), indent=2, sort_keys=True) + "\n"
    _atomic(folder / ADAPTER_CONFIG, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return sorted(tensors)


def _atomic(dest: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600: a server under another user reads it
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def read_adapter_config(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8"))


def read_adapter(folder: str | Path) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """(adapter_config, {HF module path: (A, B)}) of a PEFT folder, tensors as torch float32."""
    from safetensors.torch import load_file

    config = read_adapter_config(folder)
    flat = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in flat.items():
        m = PEFT_KEY.match(key)
        if m is None:
            raise ValueError(f"{key}: not a PEFT LoRA key (expected base_model.model.<module>.lora_A/B.weight)")
        pairs.setdefault(m.group("module"), {})[m.group("ab")] = tensor
    modules = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{module}: lora_A or lora_B is missing")
        modules[module] = (ab["A"], ab["B"])
    return config, modules


__all__ = [
    "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "adapter_init", "hf_module_of_titan", "split_fused_qkv", "peft_tensors",
    "adapter_config", "write_adapter", "is_adapter_folder", "read_adapter_config", "read_adapter", "clean_fqn",
]
