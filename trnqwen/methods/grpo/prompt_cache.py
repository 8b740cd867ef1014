"""GRPO's prompts as the token cache the ranks read (``Method.prompts``), and ``trnqwen data --method grpo``.

The cache is the house's (:mod:`trnqwen.dataset.cache`), so the ranks' dataloader, its sharding,
its seeded epochs and its resumable position are the same as every method's.  One row per prompt::

    input_ids    [N, S]  the prompt's tokens from position 0, then the pad id
    labels       [N, S]  -100 except position 0 (one "valid token" per prompt: torchtitan's count)
    positions    [N, S]  0 .. S-1
    prompt_mask  [N, S]  1 on the prompt's tokens (an extra array)
    train.records.jsonl  one line per row: where the record came from and its other columns (the
                         rewards' keyword arguments), unchanged

The held-out prompts (what ``trnqwen eval`` scores with the run's rewards) are a ``val`` split of
the same shape (``val.records.jsonl``): ``--val-dataset FILE``'s prompts, or a seeded
``--val-split`` share of the records (not trained), or without either, for the bundled task, its
own held-out file (``tiny_sums/sums_heldout.jsonl``).

Only prompts that leave room for a whole completion are kept (``prompt tokens <= seq_len -
max_completion_length``, :func:`trnqwen.methods.grpo.data.encode_prompts`).  Without ``--dataset``
the bundled task (``trnqwen/data/tiny_sums/sums.jsonl``) is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from trnqwen.dataset import cache
from trnqwen.errors import UsageError
from trnqwen.methods.grpo import data

RECORDS_FILE = "{split}.records.jsonl"
PIPELINE = "grpo-prompts-1"


def bundled_prompts_path() -> Path:
    from trnqwen.data import sums_recipe

    return sums_recipe.sums_path()


def dataset_of(cfg) -> str:
    return str(cfg.dataset) if cfg.dataset else str(bundled_prompts_path())


def _tokenizer(cfg, assets_dir: Path):
    from trnqwen.dataset.chat import load_tokenizer

    return load_tokenizer(Path(assets_dir))


def _records(cfg) -> list[data.PromptRecord]:
    if getattr(cfg, "datasets", None):
        raise UsageError("--method grpo reads one prompt dataset; [[datasets]] mixtures are not read yet",
                         hint="merge the prompt files into one, or pass one as --dataset")
    return data.load_prompts(dataset_of(cfg), split=cfg.dataset_split or "train")


def val_source(cfg) -> Optional[str]:
    """Where the held-out prompts come from when they are a file of their own: ``--val-dataset``, else
    the bundled task's held-out file (no ``--dataset`` and no ``--val-split``); None otherwise."""
    if getattr(cfg, "val_dataset", None):
        return str(cfg.val_dataset)
    if not cfg.dataset and not getattr(cfg, "val_split", 0):
        from trnqwen.data import sums_recipe

        return str(sums_recipe.sums_path(sums_recipe.HELDOUT_NAME))
    return None


def split_records(cfg, records: list[data.PromptRecord]) -> tuple[list[data.PromptRecord], list[data.PromptRecord]]:
    """(train, held out): ``--val-split``'s share of ``records`` held out in a seeded order (at least
    one, never all), else every record trained and the held-out prompts from :func:`val_source`."""
    share = float(getattr(cfg, "val_split", 0) or 0)
    source = val_source(cfg)
    if source is not None:
        return records, data.load_prompts(source)
    if share <= 0:
        return records, []
    import random

    if len(records) < 2:
        raise UsageError(f"--val-split {share:g}: {len(records)} prompt(s) cannot be split into training and held-out "
                         "prompts", hint="add prompts, or pass the held-out prompts as --val-dataset FILE")
    order = list(range(len(records)))
    random.Random(getattr(cfg, "seed", None) or 0).shuffle(order)
    n = min(len(records) - 1, max(1, round(len(records) * share)))
    held = set(order[:n])
    return ([r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held])


def _key(cfg, assets_dir: Path) -> str:
    from trnqwen.dataset.chat import tokenizer_files
    from trnqwen.dataset.sources import resolve_source

    key = cache.ContentKey()
    resolve_source(dataset_of(cfg), split=cfg.dataset_split or "train").add_to_key(key, "data")
    source = val_source(cfg)
    if source is not None:
        resolve_source(source).add_to_key(key, "val_data")
    key.add_files("tokenizer", tokenizer_files(Path(assets_dir)))
    key.add_settings({"method": "grpo", "seq_len": cfg.seq_len, "max_completion_length": cfg.max_completion_length,
                      "enable_thinking": cfg.enable_thinking, "pipeline": PIPELINE,
                      "val_split": float(getattr(cfg, "val_split", 0) or 0),
                      "seed": getattr(cfg, "seed", None) if getattr(cfg, "val_split", 0) else None})
    return key.hexdigest()


def prepare(cfg, assets_dir: Path, cache_root: Optional[Path] = None) -> cache.RankData:
    """The prompts' token cache (found by its key, or written once); :class:`RankData` for the plan."""
    assets_dir = Path(assets_dir)
    cache_root = Path(cache_root or getattr(cfg, "data_cache_dir", None) or cache.default_cache_root())
    records, held_out = split_records(cfg, _records(cfg))
    key = _key(cfg, assets_dir)
    found = cache.lookup(cache_root, key)
    if found is not None:
        return cache.RankData.from_cache(found)
    tokenizer = _tokenizer(cfg, assets_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    splits, files, kept = {}, {}, {}
    for name, part in (("train", records), ("val", held_out)):
        if not part:
            continue
        encoded = data.encode_prompts(tokenizer, part, seq_len=cfg.seq_len, max_completion_length=cfg.max_completion_length,
                                      enable_thinking=cfg.enable_thinking)
        splits[name], files[RECORDS_FILE.format(split=name)] = _split(encoded, int(cfg.seq_len), int(pad))
        kept[name] = encoded
    train = kept["train"]
    report = {"format": "prompts", "records": len(records), "kept": len(train.prompts), "dropped": len(train.dropped),
              "room": train.room, "columns": data.column_names(records),
              "val_prompts": len(kept["val"].prompts) if "val" in kept else 0}
    directory = cache.write_cache(
        cache_root, key, splits, seq_len=int(cfg.seq_len), packing=False, pad_id=int(pad), eos_id=tokenizer.eos_token_id,
        extra_meta={"method": "grpo", "source": dataset_of(cfg), "val_source": val_source(cfg), "format": "prompts",
                    "report": report, "max_completion_length": int(cfg.max_completion_length)},
        extra_files=files,
    )
    return cache.RankData.from_cache(directory)


def _split(encoded: data.PromptSet, s: int, pad: int) -> tuple[cache.SplitArrays, str]:
    """One split's arrays (module doc) and its records file's text."""
    import numpy as np

    n = len(encoded.prompts)
    ids = np.full((n, s), pad, dtype=np.int32)
    mask = np.zeros((n, s), dtype=np.int32)
    labels = np.full((n, s), cache.IGNORE_INDEX, dtype=np.int32)
    labels[:, 0] = 0
    for i, prompt in enumerate(encoded.prompts):
        ids[i, :len(prompt.ids)] = prompt.ids
        mask[i, :len(prompt.ids)] = 1
    positions = np.broadcast_to(np.arange(s, dtype=np.int32), (n, s)).copy()
    split = cache.SplitArrays(ids, labels, positions, documents=n, padding_tokens=int(n * s - mask.sum()),
                              extra={"prompt_mask": mask})
    lines = "".join(json.dumps({"where": p.record.where, "prompt": p.record.prompt, "columns": p.record.columns},
                               default=str) + "\n" for p in encoded.prompts)
    return split, lines


def read_records(cache_dir: Path, split: str = "train") -> list[dict[str, Any]]:
    """The rows' records (``where``, ``prompt``, ``columns``), in row order (the ranks' reward input)."""
    text = cache.read_extra_file(cache_dir, RECORDS_FILE.format(split=split))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def preview(cfg, assets_dir: Path) -> dict[str, Any]:
    """What ``trnqwen data --method grpo`` reports (plain data: ``--json`` prints it)."""
    records = _records(cfg)
    report = data.preview(_tokenizer(cfg, assets_dir), records, seq_len=cfg.seq_len,
                          max_completion_length=cfg.max_completion_length, enable_thinking=cfg.enable_thinking)
    return {"dataset": dataset_of(cfg), **report}


def print_preview(report: dict[str, Any]) -> None:
    from trnqwen import output

    console = output.console()
    lengths = report["prompt_tokens"]
    console.print(f"[bold]{report['dataset']}[/bold]: {report['format']}, {report['records']} record(s)")
    console.print(f"  kept {report['kept']}, dropped {report['dropped']}"
                  + (f" ({'; '.join(report['dropped_records'])})" if report["dropped_records"] else ""))
    console.print(f"  prompt tokens: min {lengths['min']}, mean {lengths['mean']}, p95 {lengths['p95']}, max "
                  f"{lengths['max']} (room {report['room']} = --seq-len {report['seq_len']} - "
                  f"--max-completion-length {report['max_completion_length']})")
    console.print(f"  columns the rewards get: {', '.join(report['columns']) or 'none'}")
    sample = report["sample"]
    console.print(f"  {sample['where']} as the model reads it ({sample['tokens']} tokens):", markup=False)
    console.print(sample["text"], markup=False, highlight=False)
