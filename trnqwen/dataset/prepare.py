"""The launcher's one call: a dataset + the model's tokenizer + settings -> a token cache.

``prepare_dataset(cfg, assets_dir)`` reads the records, detects their format, renders them with
the model's chat template, masks everything but the answers, packs them into fixed-shape rows
and writes the cache (``cache.py``) once; a second call with the same dataset bytes, tokenizer
files and settings finds the cache by its key and reads nothing else.  ``trnqwen data`` and
``trnqwen train`` call the same function, so what ``data`` reports is what the ranks train on.

Every record dropped or cut is counted with its reason in the report: nothing vanishes silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from trnqwen.dataset import bounded, cache, mixture
from trnqwen.dataset.formats import FORMATS, Example, detect_format, normalise
from trnqwen.dataset.mapping import mapping_from, mapping_settings
from trnqwen.dataset.sources import Record, Source, resolve_source
from trnqwen.dataset.template import ChatTemplate, resolve_template, template_context
from trnqwen.errors import UsageError
from trnqwen.fsutil import expand_user

_log = logging.getLogger(__name__)
# Bump when the rendering/masking/packing rules change, so old caches are not reused.
PIPELINE_VERSION = 3  # 2: "weight": 0, tools and tool turns (issue 28); a .txt BOM dropped; 3: best-fit packing
REPORT_KEYS = (
    "format", "records", "kept", "dropped", "truncated", "train_records", "tokens", "trained_tokens", "sequences",
    "padding_fraction", "val_records", "val_sequences", "val_tokens", "val_trained_tokens", "problems", "warnings",
    "sample", "sources", "mapping", "packing_strategy", "sequential_padding_fraction", "chat_template",
)


@dataclass
class DataSettings:
    """Everything that changes the tokens (all of it goes into the cache key)."""

    dataset: Optional[str] = None  # None = the bundled chat set
    dataset_format: Optional[str] = None  # None / "auto" = detect from the records
    dataset_split: str = "train"
    seq_len: int = 2048
    packing: bool = True
    long_conversations: str = "truncate"
    train_on_inputs: bool = False
    val_split: float = 0.0
    val_dataset: Optional[str] = None
    seed: int = 42
    method: str = "sft"  # the training method the cache is for (its name goes into the key and meta.json)
    # the records that method reads: "chat" (SFT formats) or "preference" (pairs: trnqwen.dataset.preference);
    # the caller asks the method (trnqwen.methods.registry; RunConfig.data_kind): dataset/ never does
    data_kind: str = "chat"
    # preference pairs: where a trained answer ends ("im_end", or "trl": also the template's newline
    # after it); declared with the pair methods' settings (methods/pair_settings.py)
    answer_end: str = "im_end"
    # the methods that train on preference pairs, named in the hints (``add --method X``); the caller
    # asks the registry (prepare_dataset's pair_methods): not part of the cache key
    pair_methods: tuple[str, ...] = ()
    # trnqwen.dataset.settings: the one dataset's mapping (the keys set), several datasets (their tables),
    # packing, the chat template
    mapping: dict[str, Any] = field(default_factory=dict)
    datasets: list[dict[str, Any]] = field(default_factory=list)
    packing_strategy: str = "best-fit"
    chat_template: Optional[str] = None
    enable_thinking: Optional[bool] = None

    @classmethod
    def from_config(cls, cfg: Any) -> DataSettings:
        """From a RunConfig (fields missing on older configs keep their defaults)."""
        names = cls.__dataclass_fields__
        values = {name: getattr(cfg, name) for name in names if getattr(cfg, name, None) is not None}
        values["mapping"] = mapping_settings(cfg)
        values["datasets"] = [e.model_dump(exclude_none=True) if hasattr(e, "model_dump") else dict(e)
                              for e in values.get("datasets") or []]
        return cls(**values)

    def key_fields(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out.pop("dataset")
        out.pop("val_dataset")  # their content is hashed instead of their names
        out.pop("mapping")  # in each source's part of the key
        out.pop("chat_template")  # its text is hashed instead of its name
        out["datasets"] = [{k: v for k, v in entry.items() if k != "path"} for entry in self.datasets]
        out["dataset_format"] = self.dataset_format or "auto"
        if not self.seeded:
            out.pop("seed")
        out.pop("data_kind")  # the method names it (caches keep their keys)
        out.pop("pair_methods")
        if self.answer_end == "im_end" or self.data_kind == "chat":
            out.pop("answer_end")  # the default (caches keep their keys), or chat data, which does not read it
        if self.method == "sft":
            out.pop("method")  # SFT caches keep the keys they had before preference data existed
        return out

    @property
    def seeded(self) -> bool:
        """Whether the seed changes the tokens: a held-out split, best-fit's row order, a mixture's choice."""
        return bool(self.val_split or (self.packing and self.packing_strategy == "best-fit") or self.datasets)


@dataclass
class PreparedData:
    """A ready cache: where it is, whether it was reused, and what is in it (``report``)."""

    cache_dir: Path
    key: str
    reused: bool
    report: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str = "train") -> cache.TokenSplit:
        return cache.open_split(self.cache_dir, name)


def prepare_dataset(cfg: Any, assets_dir: Optional[Path] = None, *, cache_root: Optional[Path] = None,
                    pair_methods: tuple[str, ...] = (), progress: Optional[bounded.Progress] = None) -> PreparedData:
    """Tokenize ``cfg.dataset`` with the snapshot in ``assets_dir`` into the cache (or reuse it).
    ``pair_methods``: the methods that train on pairs, for the hints (the caller asks the registry);
    ``progress``: see :func:`prepare`."""
    settings = cfg if isinstance(cfg, DataSettings) else DataSettings.from_config(cfg)
    if pair_methods:
        settings = replace(settings, pair_methods=tuple(pair_methods))
    if assets_dir is None:
        assets_dir = cfg.resolved_assets_dir
    if cache_root is None:
        cache_root = getattr(cfg, "data_cache_dir", None) or cache.default_cache_root()
    model = getattr(cfg, "model", None)
    if model and not _existing_cache(settings.dataset):
        from trnqwen.dataset.chat import tokenizer_files

        if not tokenizer_files(Path(assets_dir)):
            raise UsageError(
                f"no tokenizer in {assets_dir}: the data is tokenized with the model's own tokenizer and template",
                hint=f"trnqwen fetch {model} first, or point --assets at the model's snapshot",
            )
    return prepare(settings, Path(assets_dir), Path(cache_root), progress=progress)


def prepare(settings: DataSettings, assets_dir: Path, cache_root: Path, *, bounded_memory: Optional[bool] = None,
            progress: Optional[bounded.Progress] = None, workers: Optional[int] = None) -> PreparedData:
    """The cache for ``settings`` (see the module).  ``bounded_memory``: keep the documents on disk
    while preparing (trnqwen.dataset.bounded; the same cache); None = when the data is large.
    ``progress``: told (bytes read, bytes in all) as bounded preparation reads; ``workers``: the
    processes it renders and tokenizes with (None = the CPUs, up to bounded.MAX_WORKERS; the same cache)."""
    from trnqwen.dataset import chat

    _check_settings(settings)
    prepared = _existing_cache(settings.dataset)
    if prepared is not None:
        _check_cache_method(prepared, settings.method)
        check_cache_settings(settings, cache.read_meta(prepared.cache_dir), prepared.cache_dir)
        return prepared
    if settings.dataset is None and settings.data_kind == "preference" and not settings.datasets:
        from trnqwen.dataset.preference import bundled_pairs_path

        settings = replace(settings, dataset=str(bundled_pairs_path()))
    parts = resolve_parts(settings)
    val_source = (resolve_source(settings.val_dataset, split=settings.dataset_split, mapping=mapping_from(settings.mapping))
                  if settings.val_dataset else None)
    template = resolve_template(settings.chat_template)
    key = _key(settings, parts, val_source, assets_dir, template)
    # What the folders hold beside the data is not in the key: said afresh on every call.
    warnings = [note for part in parts for note in part.source.skipped]
    if val_source is not None:
        warnings += val_source.skipped
        warnings += [w for part in parts for w in _same_data(part.source, val_source, settings.val_dataset)]
    found = cache.lookup(cache_root, key)
    if found is not None:  # built from the same bytes, maybe read from another path: this call's names win
        report = {**cache.read_meta(found).get("report", {}), "source": _name(parts), "warnings": warnings}
        return PreparedData(found, key, True, report)

    if settings.data_kind == "preference":
        from trnqwen.dataset import preference

        directory, report = preference.write_pairs(settings, assets_dir, cache_root, key, parts, val_source, template)
        return PreparedData(directory, key, False, {**report, "warnings": warnings})
    if bounded.wanted(parts, val_source) if bounded_memory is None else bounded_memory:
        return _prepare_bounded(settings, parts, val_source, assets_dir, cache_root, key, warnings, template, progress,
                                workers)
    loaded = mixture.load_parts(parts, val_source, lambda source, fmt: _examples(source, settings, fmt),
                                forced=settings.dataset_format, val_split=settings.val_split, seed=settings.seed)
    context = template_context(settings.enable_thinking)
    tokenizer = chat.load_tokenizer(assets_dir, template, context)
    texts, spans = chat.render(tokenizer, loaded.units, train_on_inputs=settings.train_on_inputs, context=context)
    docs = chat.tokenize(tokenizer, texts, spans)
    return _pack_and_write(settings, docs, loaded, parts, tokenizer, cache_root, key, warnings, template)


def _name(parts: list[mixture.Part]) -> str:
    """The data's name in the report: the dataset, or a mixture's joined."""
    return " + ".join(part.name for part in parts)


def resolve_parts(settings: DataSettings) -> list[mixture.Part]:
    """The run's datasets as :class:`~trnqwen.dataset.mixture.Part` s (the launcher checks them too)."""
    return mixture.resolve_parts(settings.dataset, settings.datasets, split=settings.dataset_split,
                                 fmt=settings.dataset_format, mapping=settings.mapping)


def _same_data(source: Source, val_source: Source, val_name: Optional[str]) -> list[str]:
    """A warning when ``--val-dataset`` holds the training data (the same file, or a copy of it):
    its loss would then measure records the model trains on."""
    if source.hub_name or val_source.hub_name:
        same = [source.hub_name] if (source.hub_name, source.split) == (val_source.hub_name, val_source.split) else []
    else:
        same = [str(v) for v in val_source.files if any(_same_file(v, t) for t in source.files)]
    if not same:
        return []
    return [f"--val-dataset {val_name} is training data too ({', '.join(same[:3])}{', ...' if len(same) > 3 else ''} "
            "is also in --dataset): its validation loss measures records the model trains on"]


def _same_file(a: Path, b: Path) -> bool:
    import filecmp

    try:
        return a.samefile(b) or (a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False))
    except OSError:
        return False


def _existing_cache(dataset: Optional[str]) -> Optional[PreparedData]:
    """``--dataset`` naming a cache folder itself (what ``trnqwen data`` printed): use it as is."""
    if not dataset:
        return None
    path = expand_user(dataset)
    found = cache.lookup(path.parent, path.name) if path.is_dir() else None
    if found is None:
        return None
    return PreparedData(found, path.name, True, cache.read_meta(found).get("report", {}))


def _check_cache_method(prepared: PreparedData, method: str) -> None:
    meta = cache.read_meta(prepared.cache_dir)
    made_for = meta.get("method", "sft")
    if made_for != method:
        raise UsageError(
            f"the token cache {prepared.cache_dir} holds {'preference pairs' if 'pairs_per_row' in meta else 'SFT rows'}, "
            f"not data for --method {method}",
            hint=f"use --method {made_for}, or give the records themselves as --dataset",
        )


def _flag(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"--{'' if value else 'no-'}{name.replace('_', '-')}"
    return f"--{name.replace('_', '-')} {value if value is not None else '(none)'}"


def check_cache_settings(settings: Any, meta: dict[str, Any], cache_dir: Path) -> None:
    """``--dataset`` naming a token cache trains on the cache as it was prepared: a data setting
    given away from its default that disagrees with the cache is refused (all of them in one line),
    never silently ignored.  ``settings``: a DataSettings or a RunConfig."""
    if not isinstance(settings, DataSettings):
        settings = DataSettings.from_config(settings)
    defaults = DataSettings()
    recorded = {**defaults.__dict__, **(meta.get("settings") or {})}
    recorded["seq_len"], recorded["packing"] = meta.get("seq_len", recorded["seq_len"]), meta.get("packing", recorded["packing"])
    recorded["dataset_format"] = meta.get("format") or recorded["dataset_format"]
    wrong = []
    if settings.datasets or settings.mapping:
        wrong.append("[[datasets]] or a mapping (a cache's records are already read)")
    for name in ("seq_len", "packing", "train_on_inputs", "long_conversations", "val_split", "val_dataset",
                 "dataset_format", "dataset_split", "packing_strategy", "chat_template", "enable_thinking"):
        value = getattr(settings, name)
        if name == "dataset_format" and value == "auto":
            value = None
        if value == getattr(defaults, name) or value == recorded.get(name):
            continue
        theirs = recorded.get(name)
        if name == "seq_len":
            wrong.append(f"--seq-len {value} (the cache holds {theirs}-token sequences)")
            continue
        shown = _flag(name, theirs) if isinstance(theirs, bool) else ("none" if theirs is None else theirs)
        wrong.append(f"{_flag(name, value)} (the cache: {shown})")
    if wrong:
        raise UsageError(
            f"--dataset {cache_dir} is a token cache, prepared with other data settings than "
            f"{'these' if len(wrong) > 1 else 'this one'}: {'; '.join(wrong)}",
            hint="drop those settings to use the cache as it is, or pass the original data as --dataset "
            "to prepare it with them",
        )


def _check_settings(settings: DataSettings) -> None:
    from trnqwen.dataset.preference_formats import PREFERENCE_FORMATS

    if settings.dataset_format not in (None, "auto", *FORMATS, *PREFERENCE_FORMATS):
        raise UsageError(f"--dataset-format must be one of: auto, {', '.join(FORMATS + PREFERENCE_FORMATS)}")
    if settings.data_kind == "chat" and settings.dataset_format in PREFERENCE_FORMATS:
        raise UsageError(f"--dataset-format {settings.dataset_format} holds preference pairs",
                         hint=f"add {pair_method_flags(settings.pair_methods)} (docs/preference.md)")
    if not 0.0 <= settings.val_split < 1.0:
        raise UsageError(f"--val-split must be in [0, 1), got {settings.val_split}")
    if settings.val_split and settings.val_dataset:
        raise UsageError("--val-split and --val-dataset both given", hint="pick one way to get validation data")
    if settings.data_kind == "preference" and settings.train_on_inputs:
        raise UsageError(f"--train-on-inputs has no meaning with --method {settings.method}: only the answers are compared",
                         hint="drop --train-on-inputs")


def _key(settings: DataSettings, parts: list[mixture.Part], val_source: Optional[Source], assets_dir: Path,
         template: Optional[ChatTemplate]) -> str:
    from trnqwen.dataset.chat import tokenizer_files

    key = cache.ContentKey()
    for i, part in enumerate(parts):
        part.source.add_to_key(key, "data" if i == 0 else f"data{i}")
        if part.val_source is not None:
            part.val_source.add_to_key(key, f"val{i}")
    if template is not None:
        key.add_text("chat_template", template.text)
    if val_source is not None:
        val_source.add_to_key(key, "val")
    files = tokenizer_files(assets_dir)
    if not files:
        raise UsageError(
            f"no tokenizer in {assets_dir}",
            hint="fetch the model first (trnqwen fetch <model>) or point --assets at its snapshot",
        )
    key.add_files("tokenizer", files)
    key.add_settings({**settings.key_fields(), "pipeline": PIPELINE_VERSION})
    return key.hexdigest()


def pair_method_flags(names: tuple[str, ...]) -> str:
    """``--method a`` / ``--method a or --method b``: the methods that read pairs (handed in), as flags."""
    flags = [f"--method {name}" for name in names] or ["--method <a method that trains on pairs>"]
    return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " or " + flags[-1]


def _detect(source: Source, first: Optional[Record], settings: DataSettings, forced: Optional[str] = None) -> str:
    """The format of ``source`` from its first record (``forced`` wins); no records, or a preference
    pair in a supervised run, refused."""
    forced = forced or settings.dataset_format
    if first is None:
        raise UsageError(f"dataset {source.name} has no records", hint="point --dataset at data with records in it")
    if isinstance(first.data, dict) and "chosen" in first.data and "rejected" in first.data and forced in (None, "auto"):
        raise UsageError(
            f"{first.where}: a preference pair (chosen/rejected), but this run is supervised "
            f"(--method {settings.method})",
            hint=f"train on pairs with {pair_method_flags(settings.pair_methods)} (docs/preference.md), "
                 "or give chat records",
        )
    return forced if forced not in (None, "auto") else detect_format(first, columns=source.columns)


def _examples(source: Source, settings: DataSettings, forced: Optional[str] = None) -> tuple[list[Example], str, int]:
    records = source.records()
    fmt = _detect(source, records[0] if records else None, settings, forced)
    return normalise(records, fmt), fmt, len(records)


def _pack_and_write(settings, docs, loaded: mixture.Loaded, parts: list[mixture.Part], tokenizer, cache_root, key,
                    warnings, template: Optional[ChatTemplate]):
    from trnqwen.dataset import packing

    fitted = packing.fit_documents(docs, settings.seq_len, settings.long_conversations)
    kept = np.zeros(len(docs), dtype=bool)
    kept[fitted.keep] = True
    train_docs, val_docs = _chosen(settings, loaded, parts, kept, fitted.targets)
    build = _build(settings, tokenizer)
    splits = {"train": packing.build_rows(docs, fitted, train_docs, **build)}
    if len(val_docs):
        splits["val"] = packing.build_rows(docs, fitted, val_docs, **build)
    seq_len = settings.seq_len
    fit = {
        "kept": int(len(fitted.keep)),
        "dropped": int(sum(len(v) for v in fitted.dropped.values())),
        "dropped_reasons": {reason: len(v) for reason, v in fitted.dropped.items()},
        "truncated": len(fitted.truncated),
        "problems": packing.fit_problems("record", f"longer than {seq_len} tokens truncated to {seq_len}",
                                         fitted.truncated, fitted.dropped, lambda i: loaded.units[i].where),
        "sample": _sample(docs, int(train_docs[0]), seq_len),
    }
    return _finish(settings, loaded, parts, splits, train_docs, len(val_docs), np.minimum(docs.lengths, seq_len),
                   fitted.targets, fit, tokenizer, cache_root, key, warnings, template)


def _chosen(settings, loaded: mixture.Loaded, parts, kept: np.ndarray, targets: np.ndarray,
            alloc: Optional[mixture.Alloc] = None) -> tuple[np.ndarray, np.ndarray]:
    """(training documents, the mixture's choice; validation documents) of those ``kept`` after fitting;
    ``alloc``: where the kept indices go (bounded preparation's memory maps)."""
    train_docs = mixture.select(parts, loaded, mixture.take_kept(loaded.train_idx, kept, alloc), targets, settings.seed, alloc)
    val_docs = mixture.take_kept(loaded.val_idx, kept, alloc)
    if not len(train_docs):
        raise UsageError(
            f"dataset {_name(parts)}: no trained tokens left in any record within --seq-len {settings.seq_len}",
            hint="raise --seq-len, or use --long-conversations truncate with shorter prompts",
        )
    if not len(val_docs) and len(loaded.val_idx):
        raise UsageError("every validation record was dropped", hint="raise --seq-len or pick other validation data")
    return train_docs, val_docs


def _build(settings, tokenizer) -> dict[str, Any]:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return dict(seq_len=settings.seq_len, packing=settings.packing, pad_id=int(pad_id),
                strategy=settings.packing_strategy, seed=settings.seed)


def _finish(settings, loaded: mixture.Loaded, parts, splits, train_docs, n_val: int, tokens: np.ndarray,
            targets: np.ndarray, fit: dict[str, Any], tokenizer, cache_root, key, warnings,
            template: Optional[ChatTemplate]) -> PreparedData:
    """The report and the cache, for rows built in memory or block by block (trnqwen.dataset.bounded)."""
    name = _name(parts)
    report = _report(settings, loaded.format, loaded.records, splits, train_docs, n_val, fit)
    report.update(mixture.report(parts, loaded, train_docs, tokens, targets, packing=settings.packing,
                                 strategy=settings.packing_strategy, seq_len=settings.seq_len, template=template))
    report["warnings"] = warnings
    report["source"] = name
    pad_id = _build(settings, tokenizer)["pad_id"]
    directory = cache.write_cache(
        cache_root, key, splits, seq_len=settings.seq_len, packing=settings.packing, pad_id=pad_id,
        eos_id=tokenizer.convert_tokens_to_ids(_eos_token(tokenizer)),
        extra_meta={"format": loaded.format, "source": name, "report": report,
                    "settings": {**settings.__dict__}, "chat_template": template.text if template else None},
    )
    return PreparedData(directory, key, False, report)


def _prepare_bounded(settings, parts, val_source, assets_dir, cache_root, key, warnings, template,
                     progress: Optional[bounded.Progress], workers: Optional[int]) -> PreparedData:
    """``prepare`` for data larger than memory: the same cache, its documents kept on disk (bounded.py)."""
    from trnqwen.dataset import chat

    context = template_context(settings.enable_thinking)
    tokenizer = chat.load_tokenizer(assets_dir, template, context)
    folder = bounded.scratch(cache_root, key)
    try:
        store = bounded.DocStore(folder)
        encoder = bounded.Encoder(tokenizer, settings.seq_len, settings.long_conversations, settings.train_on_inputs,
                                  context)
        workers = bounded.default_workers() if workers is None else workers
        loaded = bounded.read_documents(
            parts, val_source, store, encoder, detect=lambda source, first, fmt: _detect(source, first, settings, fmt),
            forced=settings.dataset_format, val_split=settings.val_split, seed=settings.seed, workers=workers,
            progress=progress)
        _log.info("chat template: %d renders pasted from role skeletons, %d rendered by jinja", *store.renders)
        _log.info("token starts: %d chunks counted from byte lengths, %d redone with the tokenizer's offsets", *store.starts)
        bounds, cut, targets, kept = store.arrays()
        train_docs, val_docs = _chosen(settings, loaded, parts, kept, targets, store.scratch_array)
        build = _build(settings, tokenizer)
        splits = {"train": bounded.split_rows(store, bounds, cut, targets, train_docs, workers=workers, **build)}
        if len(val_docs):
            splits["val"] = bounded.split_rows(store, bounds, cut, targets, val_docs, workers=workers, **build)
        seq_len = settings.seq_len
        # the sample: the first training record, read and tokenized again
        d = int(train_docs[0])
        i = int(loaded.part_of[d])
        record = bounded.nth_record(parts[i].source, d - mixture.first_of_part(loaded.part_of, i))
        texts, spans = chat.render(tokenizer, normalise([record], loaded.formats[i]),
                                   train_on_inputs=settings.train_on_inputs, context=context)
        fit = {
            "kept": int(np.count_nonzero(kept)),
            "dropped": int(sum(store.dropped_counts().values())),
            "dropped_reasons": store.dropped_counts(),
            "truncated": int(store.truncated[0]),
            "problems": store.problems("record", f"longer than {seq_len} tokens truncated to {seq_len}"),
            "sample": _sample(chat.tokenize(tokenizer, texts, spans), 0, seq_len),
        }
        # a document's tokens within seq_len: the report reads them for the chosen (kept) documents
        # only, whose cut length is just that
        return _finish(settings, loaded, parts, splits, train_docs, len(val_docs), cut, targets, fit, tokenizer,
                       cache_root, key, warnings, template)
    finally:
        bounded.remove(folder)


def _eos_token(tokenizer) -> str:
    from trnqwen.dataset.chat import end_of_turn

    return end_of_turn(tokenizer)


def _report(settings, fmt, n_records, splits, train_docs, n_val, fit: dict[str, Any]) -> dict[str, Any]:
    train = splits["train"].stats()
    seq_len = settings.seq_len
    val = splits["val"].stats() if "val" in splits else {"sequences": 0, "tokens": 0, "trained_tokens": 0, "padding_tokens": 0}
    return {
        "format": fmt,
        "records": int(n_records),
        "kept": fit["kept"],
        "dropped": fit["dropped"],
        "dropped_reasons": fit["dropped_reasons"],
        "truncated": fit["truncated"],
        "tokens": train["tokens"],
        "trained_tokens": train["trained_tokens"],
        "sequences": train["sequences"],
        "seq_len": seq_len,
        "packing": settings.packing,
        "padding_fraction": round(train["padding_tokens"] / max(1, train["sequences"] * seq_len), 4),
        "train_records": int(len(train_docs)),
        "val_records": int(n_val),
        "val_sequences": val["sequences"],
        "val_tokens": val["tokens"],
        "val_trained_tokens": val["trained_tokens"],
        "val_padding_fraction": round(val["padding_tokens"] / max(1, val["sequences"] * seq_len), 4),
        "problems": fit["problems"],
        "sample": fit["sample"],
    }


def _sample(docs, d: int, seq_len: int) -> dict[str, Any]:
    """The first training document as text, with the character spans that are trained.

    A token counts as trained when it is a target (the model predicts it); a truncated document
    is shown only up to what fits in ``seq_len``.
    """
    start, end = int(docs.bounds[d]), int(docs.bounds[d + 1])
    length = min(end - start, seq_len)
    text = docs.texts[d]
    limit = int(docs.char_starts[start + length]) if length < end - start else len(text)
    spans = [(s, min(e, limit)) for s, e in docs.spans[d] if s < limit]
    if spans and spans[0][0] == 0 and docs.trained[start]:  # the very first token is never a target
        first_end = int(docs.char_starts[start + 1]) if length > 1 else limit
        spans[0] = (first_end, spans[0][1])
    return {"text": text[:limit], "trained_spans": [[int(s), int(e)] for s, e in spans if e > s]}
