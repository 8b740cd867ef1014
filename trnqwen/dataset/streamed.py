"""The data torchtitan streams itself: a model's default corpus, or one of torchtitan's own names.

Every dataset the user names (a file, a folder, a Hub name, a prepared cache) is tokenized once by
the launcher into the token cache (:mod:`trnqwen.train.cache_data`, :mod:`trnqwen.dataset`, whose
``sources`` module is the one place that lists a dataset's files).  What is left is resolved here:
no ``--dataset`` (the built-in tiny model's bundled plain-text corpus; ``c4`` for real models) and
torchtitan's registered names (``c4``, ``c4_validation``; ``c4_test`` only where its files exist).
:func:`render_dataset_code` emits the matching lines of a generated config module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from trnqwen.errors import UsageError

TITAN_DATASETS = ("c4", "c4_validation", "c4_test")
DATASET_KEY = "trnqwen_data"  # name the generated module registers the default corpus under


@dataclass
class DataSpec:
    """kind: ``titan`` (a torchtitan-registered name), ``corpus`` (the bundled plain-text corpus)
    or ``cache`` (a token cache; see :func:`trnqwen.train.cache_data.prepare_rank_data`)."""

    kind: str
    source: str  # what the data is, for messages
    titan_name: Optional[str] = None
    data_files: list[str] = field(default_factory=list)  # local files (corpus) or the cache folder
    notes: list[str] = field(default_factory=list)

    @property
    def is_local(self) -> bool:
        return bool(self.data_files)


def streams_itself(dataset: Optional[str]) -> bool:
    """Whether torchtitan (not the token cache) supplies ``dataset``: none named, or one of its names."""
    return not dataset or dataset in TITAN_DATASETS


def resolve_dataset(dataset: Optional[str], *, model_is_builtin: bool, api=None) -> DataSpec:
    """The default corpus (``dataset`` None) or a torchtitan name as a :class:`DataSpec`."""
    if not dataset:
        if model_is_builtin:
            from trnqwen.fetch.builtin import corpus_path

            corpus = str(corpus_path())  # plain text, documents separated by blank lines
            return DataSpec(kind="corpus", source=corpus, data_files=[corpus])
        dataset = "c4"
    if dataset not in TITAN_DATASETS:  # a named dataset must have gone to the token cache
        raise ValueError(
            f"resolve_dataset takes no dataset or one of {TITAN_DATASETS}, not {dataset!r}; "
            "other datasets are read through trnqwen.train.cache_data.prepare_rank_data"
        )
    if dataset == "c4_test":
        from trnqwen import titan_compat as compat

        if not (api or compat.detect()).c4_test_in_package:
            raise UsageError(
                "dataset 'c4_test' is not part of the installed torchtitan (it lives in torchtitan's "
                "source repository, not in the pip package)",
                hint="pass --dataset FILE.jsonl/FOLDER, a Hub dataset name, or c4",
            )
    spec = DataSpec(kind="titan", source=dataset, titan_name=dataset)
    if dataset != "c4_test":
        spec.notes.append(f"dataset {dataset} streams from the Hugging Face Hub (network needed at train time)")
    return spec


# --- code generation ---------------------------------------------------------------------------


def render_dataset_code(spec: DataSpec) -> tuple[list[str], list[str], str]:
    """(import lines, module-level lines, expression for ``config.dataloader``) of a config module."""
    if spec.kind == "titan":
        return (
            ["from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader"],
            [],
            f"HuggingFaceTextDataLoader.Config(dataset={spec.titan_name!r})",
        )
    if spec.kind != "corpus":
        raise ValueError(f"no dataloader code for a {spec.kind!r} dataset (the token cache has its own)")
    imports = [
        "from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader",
        "from trnqwen.dataset.streamed import register_corpus",
    ]
    body = [
        "# torchtitan's own extension point for datasets: register under a name, select it by name.",
        f"register_corpus({spec.data_files!r}, {spec.source!r})",
    ]
    return imports, body, f"HuggingFaceTextDataLoader.Config(dataset={DATASET_KEY!r})"


def register_corpus(data_files: list[str], source: str) -> str:
    """Register the bundled plain-text corpus in torchtitan's ``DATASETS`` under :data:`DATASET_KEY`
    (one document per blank-line-separated paragraph) and return that name.

    The one definition of how the corpus is read: the torchtitan backends' generated config module
    calls it, and the hf-trainer ranks too (they read the corpus through torchtitan's own
    ``HuggingFaceTextDataset``), so every backend sees the same documents in the same order.
    """
    from datasets import load_dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    files = list(data_files)

    def load(path: str):
        return load_dataset("text", data_files=files, split="train", sample_by="paragraph")

    def text(sample: dict) -> str:
        return sample["text"]

    DATASETS[DATASET_KEY] = DatasetConfig(path=source, loader=load, sample_processor=text)
    return DATASET_KEY
