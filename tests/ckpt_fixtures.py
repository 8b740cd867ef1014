"""Tiny Qwen3 checkpoints in torchtitan's export layout, built offline for verify-ckpt tests.

``<root>/assets/``              config.json (+ a tiny tokenizer): the "HF snapshot"
``<root>/ckpt/step-N/``         model-0000x-of-0000y.safetensors + model.safetensors.index.json
                                (+ an empty ``sharded/`` as torchtitan leaves it)
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

TINY = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
)


def tiny_config(tied: bool = True, **over):
    from transformers import Qwen3Config

    return Qwen3Config(**{**TINY, **over}, tie_word_embeddings=tied, dtype="bfloat16")


def write_tokenizer(folder: Path, vocab_size: int = 96) -> None:
    """A character-level tokenizer (printable ASCII) saved as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 32 + vocab_size - 2)]
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(str(folder))


def char_tokenizer(folder: Path, vocab_size: int = 96) -> None:
    """A character tokenizer that knows newline (the chat template's turns end with one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n", *(chr(c) for c in range(32, 32 + vocab_size - 3))]
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(str(folder))


def state_dict_of(config, seed: int = 0):
    """A real model's weights (bf16, tied head dropped as torchtitan's export drops it)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight")
    return sd


def write_export(step_dir: Path, state: dict, shards: int = 2) -> Path:
    """Write ``state`` like torchtitan's HF export: N shards + index + empty sharded/."""
    from safetensors.torch import save_file

    step_dir.mkdir(parents=True, exist_ok=True)
    names = list(state)
    per = -(-len(names) // shards)
    weight_map = {}
    total = 0
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[i * per:(i + 1) * per]}
        save_file(part, str(step_dir / fname))
        for n, t in part.items():
            weight_map[n] = fname
            total += t.numel() * t.element_size()
    (step_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (step_dir / "sharded").mkdir(exist_ok=True)
    return step_dir


def make_case(root: Path, tied: bool = True, step: int = 3, tokenizer: bool = False, seed: int = 0, **over):
    """(checkpoint folder, assets folder, state dict) for one tiny model."""
    config = tiny_config(tied, **over)
    assets = root / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(assets))
    if tokenizer:
        write_tokenizer(assets, config.vocab_size)
    state = state_dict_of(config, seed)
    ckpt = root / "ckpt"
    write_export(ckpt / f"step-{step}", state)
    return ckpt, assets, state


def copy_case(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def tree_hash(folder: Path) -> dict[str, str]:
    """Content hash + mtime of every file: proves a check modified nothing."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest() + f":{st.st_mtime_ns}:{st.st_size}"
    return out
