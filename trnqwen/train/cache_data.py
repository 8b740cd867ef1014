"""How a prepared dataset cache reaches the ranks (launcher side; no torch).

The launcher tokenizes ``--dataset`` once into a cache (:mod:`trnqwen.dataset`), before any
rank starts.  This module turns that cache into what each backend's ranks are given:

* native / hf-v5: lines of the generated torchtitan config module selecting
  :class:`trnqwen.runtime.titan_data.TokenCacheDataLoader` for training and, with
  ``--val-every N``, torchtitan's own validator over the cache's ``val`` split;
* hf-trainer: the cache directory and ``val_every`` in its spec.

All three read the same rows in the same order (:mod:`trnqwen.runtime.token_stream`).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Callable, Optional

from trnqwen.config import RunConfig
from trnqwen.dataset.cache import RankData
from trnqwen.dataset.streamed import DataSpec
from trnqwen.errors import UsageError
from trnqwen.methods import registry as methods
from trnqwen.titan_compat import TitanAPI

TITAN_LOADER_IMPORT = "from trnqwen.runtime.titan_data import TokenCacheDataLoader"
# opens a progress display around the data's preparation, yielding its (bytes read, bytes in all) callback
DataProgress = Callable[[], AbstractContextManager[Optional[Callable[[int, int], None]]]]


def _no_progress() -> AbstractContextManager[None]:
    return nullcontext(None)


def check_run(data: RankData, *, seq_len: int, val_every: Optional[int], from_cache: bool = False) -> None:
    """What would stop the ranks, said before any of them starts (``from_cache``: ``--dataset``
    named the token cache itself, so the data settings cannot change it)."""
    if data.seq_len != seq_len:
        raise UsageError(
            f"the dataset cache {data.cache_dir} holds {data.seq_len}-token sequences, the run uses --seq-len {seq_len}",
            hint="prepare the dataset with the run's --seq-len",
        )
    if data.train_rows < 1:
        raise UsageError(f"the dataset cache {data.cache_dir} has no training sequences", hint="check the data with `trnqwen data`")
    if val_every and not data.has_val:
        if from_cache:
            source = data.meta.get("source") or "the original data"
            raise UsageError(
                f"--val-every needs a validation split, and the token cache {data.cache_dir} has none",
                hint=f"pass the original data ({source}) as --dataset with --val-split 0.05 (or --val-dataset FILE)",
            )
        raise UsageError(
            "--val-every needs a validation split, and this dataset has none",
            hint="add --val-split 0.05 (held out from the data) or --val-dataset FILE",
        )


def validation_batches(val_rows: int, *, dp_degree: int, local_batch_size: int) -> int:
    """Batches each rank reads for one pass over ``val_rows`` (the rule in ``token_stream``)."""
    per_rank = math.ceil(val_rows / dp_degree)
    return max(1, math.ceil(per_rank / local_batch_size))


def titan_dataloader_code(
    data: RankData, *, seed: Optional[int], val_every: Optional[int], dp_degree: int = 1, local_batch_size: int = 1
) -> tuple[list[str], list[str]]:
    """(imports, config-function lines) that make torchtitan read the cache (and validate on it)."""
    cache = str(data.cache_dir)
    seed_arg = f", seed={seed}" if seed else ""
    lines = [
        "# Tokenized once by the launcher; each rank reads its rows (trnqwen.runtime.token_stream).",
        f"config.dataloader = TokenCacheDataLoader.Config(cache_dir={cache!r}, split=\"train\"{seed_arg})",
    ]
    if val_every:
        lines += [
            "config.validator.enable = True",
            f"config.validator.freq = {int(val_every)}",
            "# The whole val split: every rank reads the same number of batches (the last one filled).",
            f"config.validator.steps = {validation_batches(data.val_rows, dp_degree=dp_degree, local_batch_size=local_batch_size)}",
            f"config.validator.dataloader = TokenCacheDataLoader.Config(cache_dir={cache!r}, split=\"val\", one_pass=True)",
        ]
    return [TITAN_LOADER_IMPORT], lines


def is_prepared_cache(path: Path) -> bool:
    """A directory holding a prepared cache (``trnqwen data`` output), usable as ``--dataset``."""
    return (Path(path) / "meta.json").is_file() and any(Path(path).glob("train.*.npy"))


def reads_cache(dataset: Optional[str]) -> bool:
    """Whether a run on ``dataset`` trains from the token cache (else torchtitan streams it).

    Every dataset the user names does, except torchtitan's own streamed names (``c4``...), unless
    a local file or folder has that name (a path the user can see wins, as everywhere else).  No
    ``--dataset`` keeps each model's default corpus as it was.
    """
    from trnqwen.dataset.streamed import streams_itself

    return not streams_itself(dataset) or Path(str(dataset)).expanduser().exists()


def data_name(cfg: RunConfig) -> Optional[str]:
    """What the run's data is called: ``--dataset``, or its ``[[datasets]]`` paths joined."""
    return cfg.dataset or (" + ".join(entry.path for entry in cfg.datasets) if cfg.datasets else None)


def prepare_rank_data(cfg: RunConfig, assets_dir: Path,
                      progress: Optional[DataProgress] = None) -> Optional[tuple[DataSpec, RankData]]:
    """(DataSpec, RankData) when the run reads a token cache, else None.

    Runs in the launcher before any rank starts: ``--dataset`` naming a prepared cache is used as
    it is; any other dataset the user names is tokenized once (or found in the cache) by
    :func:`trnqwen.dataset.prepare.prepare_dataset`, the code ``trnqwen data`` runs; ``progress``
    (the CLI's bar, as ``trnqwen data`` shows it) is opened around that preparation only.
    """
    if getattr(cfg, "data_kind", "chat") == "prompts":  # the method caches its own prompts (Method.prompts)
        return _prompt_data(cfg, assets_dir)
    pairs = getattr(cfg, "data_kind", "chat") == "preference"  # its method reads pairs (trnqwen.methods.registry)
    if not pairs and not cfg.datasets and not reads_cache(cfg.dataset):
        return None
    if pairs and not cfg.dataset and not cfg.datasets:  # the bundled preference set, as SFT's bundled chats
        from trnqwen.dataset.preference import bundled_pairs_path

        cfg = cfg.model_copy(update={"dataset": str(bundled_pairs_path())})
    path = Path(cfg.dataset).expanduser() if cfg.dataset else None
    notes: list[str] = []
    if path is not None and is_prepared_cache(path):
        from trnqwen.dataset.prepare import check_cache_settings

        data = RankData.from_cache(path)
        check_cache_settings(cfg, data.meta, data.cache_dir)
    else:
        from trnqwen.dataset.prepare import prepare_dataset

        from trnqwen.assets import has_tokenizer

        if not has_tokenizer(assets_dir):  # preflight reports the missing assets
            from trnqwen.dataset.prepare import DataSettings, resolve_parts

            resolve_parts(DataSettings.from_config(cfg))  # a dataset that is not there still stops here
            notes.append(f"the dataset is tokenized when the run starts (no tokenizer in {assets_dir} yet)")
            data = RankData(cache_dir=Path("<tokenized-when-the-run-starts>"), seq_len=cfg.seq_len, train_rows=1,
                            val_rows=1 if cfg.val_every else 0)
            return DataSpec(kind="cache", source=str(data_name(cfg)), notes=notes), data
        with (progress or _no_progress)() as report:
            prepared = prepare_dataset(cfg, assets_dir, pair_methods=methods.names_for_data("preference"), progress=report)
        data = RankData.from_cache(prepared.cache_dir)
        notes += _report_notes(prepared.report)
    from_cache = path is not None and is_prepared_cache(path)
    check_run(data, seq_len=cfg.seq_len, val_every=cfg.val_every, from_cache=from_cache)
    spec = DataSpec(kind="cache", source=str(data_name(cfg)), data_files=[str(data.cache_dir)], notes=notes)
    return spec, data


def _prompt_data(cfg: RunConfig, assets_dir: Path) -> tuple[DataSpec, RankData]:
    """A prompt method's data (GRPO): its own module writes (or finds) the prompts' token cache."""
    from trnqwen.assets import has_tokenizer
    from trnqwen.methods.base import load

    module = load(methods.of(cfg).prompts)
    if not has_tokenizer(assets_dir):  # preflight reports the missing assets
        data = RankData(cache_dir=Path("<tokenized-when-the-run-starts>"), seq_len=cfg.seq_len, train_rows=1)
        return DataSpec(kind="cache", source=module.dataset_of(cfg),
                        notes=[f"the prompts are tokenized when the run starts (no tokenizer in {assets_dir} yet)"]), data
    data = module.prepare(cfg, assets_dir)
    check_run(data, seq_len=cfg.seq_len, val_every=cfg.val_every)
    return DataSpec(kind="cache", source=module.dataset_of(cfg), data_files=[str(data.cache_dir)]), data


RECORDED = ("sources", "packing_strategy", "padding_fraction", "sequential_padding_fraction", "chat_template",
            "trained_tokens", "sequences")


def data_record(cache_dir: Optional[Path]) -> Optional[dict[str, Any]]:
    """What run.json keeps of the data report: each source's records, tokens and share of the
    trained tokens, the packing and its padding, the chat template (None without a cache)."""
    from trnqwen.dataset.cache import read_meta

    try:
        report = read_meta(Path(cache_dir)).get("report") or {} if cache_dir is not None else None
    except (OSError, ValueError):
        return None
    return {key: report[key] for key in RECORDED if key in report} if report is not None else None


def _report_notes(report: dict[str, Any]) -> list[str]:
    """What preparing the data left out, said before training (never dropped silently)."""
    notes = [f"dataset: {warning}" for warning in report.get("warnings") or []]
    sources = report.get("sources") or []
    if len(sources) > 1:  # a mixture: each dataset's share of the trained tokens (run.json keeps the report's)
        notes.append("dataset: mixture, share of the trained tokens: " + "; ".join(
            f"{s['source']} {s['share']:.1%} ({s['train_records']:,} records, {s['trained_tokens']:,} trained tokens)"
            for s in sources))
    dropped, truncated = int(report.get("dropped") or 0), int(report.get("truncated") or 0)
    if dropped or truncated:
        notes.append(
            f"dataset: {dropped} of {report.get('records')} record(s) dropped, {truncated} truncated "
            "(`trnqwen data` lists why)"
        )
    return notes


def streamed_data(cfg: RunConfig, *, api: Optional[TitanAPI] = None) -> DataSpec:
    """The DataSpec of a dataset torchtitan streams itself (its own names, a model's default corpus);
    ``cfg.dataset`` is one that :func:`reads_cache` turned down."""
    from trnqwen.dataset.streamed import resolve_dataset

    if cfg.val_every:
        raise UsageError(
            "--val-every validates on the validation split of a dataset you name; this run streams "
            f"{cfg.dataset or 'the default corpus'}",
            hint="pass --dataset FILE with --val-split 0.05 (or --val-dataset FILE)",
        )
    return resolve_dataset(cfg.dataset, model_is_builtin=cfg.is_builtin, api=api)
