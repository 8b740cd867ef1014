"""``builtin:tiny-qwen3``: a complete, deterministic HF snapshot of a tiny, randomly initialised Qwen3, made offline.

:func:`fetch_builtin` is what ``trnqwen fetch builtin:tiny-qwen3`` runs: it writes the snapshot
(unless a verified copy is already there) and verifies it like a Hub download.

What :func:`write_tiny_qwen3` writes is shaped like a real Qwen3 instruct repo on the Hub
(Qwen3-4B-Instruct-2507 in miniature), so everything downstream (``train`` with the native and
hf-v5 backends, ``verify-ckpt``, transformers) treats it like the real thing:

  config.json                  model_type qwen3, Qwen3ForCausalLM, tied embeddings, float32
  generation_config.json
  model-00001-of-00001.safetensors  random init from transformers' own Qwen3 init, fixed
  model.safetensors.index.json      seed, no lm_head.weight (tied, as in Qwen3-4B)
  tokenizer.json               byte-level BPE (Qwen's pre-tokenizer scheme) trained by
  tokenizer_config.json          ``tokenizers`` on the shipped corpus; ChatML chat template
  README.md                    the model card; its ``random-init`` tag says the weights are random
                               by design (inspect-logs reads it: a fine-tune of it starts at ln(vocab))

Nothing binary is committed: the tokenizer and weights are produced here, from code and the
plain-text corpus in ``trnqwen/data/tiny_corpus`` (itself written by
``trnqwen.data.corpus_recipe``).  The same bytes come out every time.

Why float32: the tiny model is trained and checked on CPU, where torchtitan trains in float32;
keeping the published weights in float32 means a fine-tuned export differs from the original
only by training (no bf16 rounding), so "did the weights load / did training move them" checks
and loss comparisons are exact, and 1M params cost 4 MB either way.

torch, transformers and tokenizers are imported inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Optional

from trnqwen.assets import INDEX_NAME, RANDOM_INIT_TAG, read_manifest
from trnqwen.constants import TINY_MODEL
from trnqwen.errors import EnvironmentProblem, UsageError
from trnqwen.fetch.plan import DEFAULT_KEEP_FREE, FetchResult, RemoteFile, check_disk
from trnqwen.fetch.verify import file_digest, verify_snapshot, write_manifest
from trnqwen.fsutil import current_umask

NAME = "tiny-qwen3"
SEED = 1234
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_TOKEN = BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
MAX_POSITIONS = 2048
MAX_PARAMS = 5_000_000

# Qwen2/Qwen3's published pre-tokenizer split (a format fact, as in the Hub's tokenizer.json).
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML as Qwen uses it: optional system turn, <|im_start|>role\n...<|im_end|>\n per message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The sharded-repo naming (as real Qwen3 repos and torchtitan's own HF export use): torchtitan's
# StateDictAdapter reads the shard number out of every weight_map file name, so a plain
# "model.safetensors" in the index breaks native loading; transformers follows the index.
WEIGHTS_FILE = "model-00001-of-00001.safetensors"

SNAPSHOT_FILES = (
    "README.md",
    "config.json",
    "generation_config.json",
    WEIGHTS_FILE,
    INDEX_NAME,
    "tokenizer.json",
    "tokenizer_config.json",
)

_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "tiny_corpus"


# --- the corpus ----------------------------------------------------------------------------


def _shipped(name: str, what: str) -> Path:
    path = _DATA_DIR / name
    if not path.is_file():
        raise EnvironmentProblem(
            f"the {what} is missing ({path})",
            hint="reinstall trnqwen, or regenerate it: python -m trnqwen.data.corpus_recipe",
        )
    return path


def corpus_path() -> Path:
    """The shipped plain-text corpus: documents separated by blank lines."""
    return _shipped("corpus.txt", "tiny corpus")


def chat_path() -> Path:
    """The shipped chat conversations: JSONL, one ``{"messages": [...]}`` per line."""
    return _shipped("chat.jsonl", "tiny chat corpus")


def corpus_documents() -> list[str]:
    """The corpus as a list of documents."""
    text = corpus_path().read_text(encoding="utf-8")
    return [doc.strip() for doc in text.split("\n\n") if doc.strip()]


# --- the snapshot ----------------------------------------------------------------------------


def tiny_qwen3_config() -> dict[str, Any]:
    """config.json, shaped like Qwen3-4B-Instruct-2507's (legacy top-level ``rope_theta``)."""
    eot, _, im_end = _special_ids()
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eot,
        "eos_token_id": im_end,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 384,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": 4,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }


def write_tiny_qwen3(dest: Path) -> Path:
    """Write the complete snapshot to ``dest`` atomically (built in a sibling temp folder, then
    swapped in).  ``dest`` may be missing, empty, or an earlier tiny-qwen3 snapshot; anything
    else is refused rather than overwritten.  Returns ``dest``."""
    dest = Path(dest).expanduser().absolute()
    _check_replaceable(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        build_snapshot(tmp)
        _swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def build_snapshot(folder: Path) -> None:
    """Write every snapshot file into an existing (empty) ``folder``; not atomic by itself."""
    _require("torch", "transformers", "tokenizers")
    folder = Path(folder)
    tok = train_tokenizer()
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    config = tiny_qwen3_config()
    _write_json(folder / "config.json", config)
    _write_json(folder / "generation_config.json", _generation_config())
    (folder / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    _write_json(folder / "tokenizer_config.json", _tokenizer_config())
    tensors = init_weights(config)
    _save_weights(folder, tensors)
    (folder / "README.md").write_text(_readme(config, tensors), encoding="utf-8")
    mode = 0o666 & ~current_umask()
    for name in SNAPSHOT_FILES:
        os.chmod(folder / name, mode)


def train_tokenizer():
    """Byte-level BPE in Qwen's scheme, trained on the shipped corpus (deterministic)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_training_texts(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def init_weights(config: dict[str, Any]) -> dict[str, Any]:
    """Random init by transformers' own Qwen3 init under a fixed seed; float32, contiguous.
    ``lm_head.weight`` is left out (tied to ``model.embed_tokens.weight``)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf_config = Qwen3Config(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model = Qwen3ForCausalLM(hf_config).to(torch.float32)
    finally:
        torch.random.set_rng_state(state)
    tensors = {
        name: t.detach().clone().contiguous()
        for name, t in sorted(model.state_dict().items())
        if name != "lm_head.weight"
    }
    count = sum(t.numel() for t in tensors.values())
    if count > MAX_PARAMS:
        raise RuntimeError(f"tiny model has {count} parameters, above the {MAX_PARAMS} bound")
    return tensors


def snapshot_digest(folder: Path) -> str:
    """sha256 over the snapshot's file names and bytes (equal snapshots, equal digests)."""
    h = hashlib.sha256()
    for name in SNAPSHOT_FILES:
        h.update(name.encode() + b"\0")
        h.update((Path(folder) / name).read_bytes())
    return h.hexdigest()


# --- helpers ---------------------------------------------------------------------------------


def _special_ids() -> tuple[int, ...]:
    base = VOCAB_SIZE - len(SPECIAL_TOKENS)
    return tuple(base + i for i in range(len(SPECIAL_TOKENS)))


def _training_texts() -> Iterator[str]:
    yield from corpus_documents()
    for line in chat_path().read_text(encoding="utf-8").splitlines():
        for message in json.loads(line)["messages"]:
            yield message["content"]


def _generation_config() -> dict[str, Any]:
    eot, _, im_end = _special_ids()
    return {
        "bos_token_id": eot,
        "do_sample": True,
        "eos_token_id": [im_end, eot],
        "pad_token_id": eot,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
    }


def _tokenizer_config() -> dict[str, Any]:
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in zip(_special_ids(), SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _save_weights(folder: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {
        "metadata": {"total_size": total, "total_parameters": sum(t.numel() for t in tensors.values())},
        "weight_map": {name: WEIGHTS_FILE for name in sorted(tensors)},
    }
    _write_json(folder / INDEX_NAME, index)


def _readme(config: dict[str, Any], tensors: dict[str, Any]) -> str:
    params = sum(t.numel() for t in tensors.values())
    return (
        "---\nlicense: apache-2.0\nlibrary_name: transformers\npipeline_tag: text-generation\n"
        f"tags:\n- {RANDOM_INIT_TAG}\n---\n"
        f"# {NAME}\n\n"
        f"A tiny, randomly initialised Qwen3 ({params:,} parameters, {config['num_hidden_layers']} layers, "
        f"hidden {config['hidden_size']}, vocab {config['vocab_size']}) written offline by "
        "`trnqwen fetch builtin:tiny-qwen3`, for testing the fine-tune lifecycle without downloads.\n"
        "Weights: transformers' Qwen3 init under a fixed seed; tokenizer: byte-level BPE trained on "
        "trnqwen's bundled corpus. Not a useful language model.\n"
    )


def _write_json(path: Path, payload: Any) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _check_replaceable(dest: Path) -> None:
    if dest.is_symlink() and not dest.exists():
        raise UsageError(f"{dest} is a broken symbolic link or a symlink loop", hint="remove it or pass another --local-dir")
    if not dest.exists():
        return
    if not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a folder", hint="pass --local-dir pointing at a folder")
    extra = sorted(p.name for p in dest.iterdir() if p.name not in SNAPSHOT_FILES and p.name != ".cache")
    if extra:
        raise UsageError(
            f"{dest} already holds other files ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}); "
            "not overwriting it with the tiny model",
            hint="pick an empty or new --local-dir",
        )


def _swap_in(tmp: Path, dest: Path) -> None:
    """Replace ``dest`` by ``tmp`` so a reader sees the old snapshot or the new one, never half."""
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        old.rmdir()
        os.replace(dest, old)
        try:
            os.replace(tmp, dest)
        except BaseException:
            os.replace(old, dest)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)
    os.chmod(dest, 0o777 & ~current_umask())


def _require(*modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise EnvironmentProblem(
            f"writing the tiny model needs {', '.join(missing)}",
            hint="pip install 'trnqwen[train]' (and torch)",
        )


# --- fetch builtin:... ------------------------------------------------------------------------

BUILTINS = (TINY_MODEL,)
_TINY_RECIPE_VERSION = 2  # 2: the card's random-init tag (inspect-logs reads it)
# An upper bound of what the snapshot takes on disk (about 4.2 MiB today; a test keeps it a bound),
# checked against --keep-free before anything is written.
SNAPSHOT_BYTES_BOUND = 8 * 1024**2


def fetch_builtin(
    repo_id: str, local_dir: Path, *, dry_run: bool = False, keep_free: int = DEFAULT_KEEP_FREE
) -> FetchResult:
    """Write a built-in model (offline) and verify it; a verified copy is left as it is.  Like a
    Hub download, writing it must leave ``keep_free`` bytes free (checked before a byte is written)."""
    if repo_id not in BUILTINS:
        raise UsageError(f"unknown built-in model {repo_id!r}", hint=f"built-in models: {', '.join(BUILTINS)}")
    manifest = read_manifest(local_dir)
    expected: Optional[list[RemoteFile]] = None
    if manifest and manifest.get("repo_id") == repo_id and manifest.get("recipe") == _TINY_RECIPE_VERSION:
        expected = [RemoteFile(**f) for f in manifest.get("expected", [])]
    current = verify_snapshot(local_dir, expected, known=manifest.get("files") if manifest else None) if expected else None
    up_to_date = current is not None and current.ok
    names = list(SNAPSHOT_FILES)
    result = FetchResult(
        repo_id=repo_id,
        local_dir=str(local_dir),
        revision=f"recipe-{_TINY_RECIPE_VERSION}",
        commit=manifest.get("commit") if up_to_date and manifest else None,
        files=names,
        bytes=sum(f.size for f in expected) if up_to_date and expected else 0,
        dry_run=dry_run,
        to_download=[] if up_to_date else names,
    )
    if dry_run:
        result.verified = up_to_date
        return result
    if not up_to_date:
        check_disk(repo_id, local_dir, SNAPSHOT_BYTES_BOUND, keep_free, verb="write")
        write_tiny_qwen3(local_dir)
        expected = [
            RemoteFile(n, (local_dir / n).stat().st_size, sha256=file_digest(local_dir / n, "sha256")) for n in names
        ]
        result.repaired = list(current.bad_files) if current else []
    assert expected is not None
    report = verify_snapshot(local_dir, expected, known=manifest.get("files") if up_to_date and manifest else None)
    digest = snapshot_digest(local_dir)
    result.commit = digest[:40]
    result.bytes = sum(f.size for f in expected)
    result.sizes = {f.path: f.size for f in expected}
    result.verified = report.ok
    result.problems, result.warnings = report.problems, report.warnings
    write_manifest(
        local_dir,
        {
            "repo_id": repo_id,
            "revision": result.revision,
            "commit": result.commit,
            "recipe": _TINY_RECIPE_VERSION,
            "verified": report.ok,
            "verified_at": time.time(),
            "files": report.checked,
            "expected": [asdict(f) for f in expected],
        },
    )
    return result
