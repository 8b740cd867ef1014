"""``trnqwen data``: the data pipeline without training: what will be trained, before any rank starts.

Examples:
  trnqwen data conversations.jsonl --model builtin:tiny-qwen3 --seq-len 256
  trnqwen data ./my_chats/ --val-split 0.05 --json | jq .trained_tokens
  trnqwen data org/dataset --dataset-split train --dataset-format sharegpt
  trnqwen data chats.jsonl --field-messages dialog --roles user=human,assistant=bot   # its own names, mapped

(each training method adds its own examples: ``Method.examples``)
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from trnqwen.cli._options import (
    AnswerEndOpt,
    AssetsOpt,
    ConfigFileOpt,
    DataCacheDirOpt,
    DatasetFormatOpt,
    DatasetSplitOpt,
    JsonOpt,
    LongConversationsOpt,
    MethodOpt,
    ModelOpt,
    PackingOpt,
    SeedOpt,
    SeqLenOpt,
    TrainOnInputsOpt,
    ValDatasetOpt,
    ValSplitOpt,
    given,
    takes_settings,
)
from trnqwen.dataset.settings import MAPPING_KEYS
from trnqwen.methods import registry

# the data settings beyond one standard file (trnqwen/dataset/settings.py), as generated options
OWN_SETTINGS = (*MAPPING_KEYS, "packing_strategy", "chat_template", "enable_thinking", "max_completion_length")

HELP = "Check and tokenize a dataset with the model's chat template: formats, trained tokens, packing."
EPILOG = """\
Examples:

\b
  trnqwen data conversations.jsonl --model builtin:tiny-qwen3 --seq-len 256
  trnqwen data ./my_chats/ --val-split 0.05 --json | jq .trained_tokens
  trnqwen data org/dataset --dataset-split train --dataset-format sharegpt{method_examples}
  trnqwen data chats.jsonl --field-messages dialog --roles user=human,assistant=bot   # its own names, mapped

Several datasets mixed by weight: [[datasets]] tables in trnqwen.toml (docs/data.md).
Uses the same code as `trnqwen train`: the tokenized cache it writes is the one training reads.
Without DATASET, the dataset from the config (or the bundled calculator chat set) is used.
Exit 0 ok, 2 bad data (one line naming the file and record), 3 a missing package.
""".format(method_examples="".join(f"\n  {e.line}      # {e.what}" for e in registry.examples("data")))


@takes_settings(only=OWN_SETTINGS)
def data(
    dataset: Annotated[
        Optional[str],
        typer.Argument(
            help="JSONL/JSON/Parquet file, a folder of them, or a Hub dataset name. [default: --dataset from the config]",
            show_default=False,
        ),
    ] = None,
    model: ModelOpt = None,
    assets: AssetsOpt = None,
    seq_len: SeqLenOpt = None,
    method: MethodOpt = None,
    dataset_format: DatasetFormatOpt = None,
    dataset_split: DatasetSplitOpt = None,
    packing: PackingOpt = None,
    long_conversations: LongConversationsOpt = None,
    train_on_inputs: TrainOnInputsOpt = None,
    val_split: ValSplitOpt = None,
    val_dataset: ValDatasetOpt = None,
    seed: SeedOpt = None,
    answer_end: AnswerEndOpt = None,
    data_cache_dir: DataCacheDirOpt = None,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
    settings: Optional[dict[str, Any]] = None,
) -> None:
    """Tokenize a dataset and report what will be trained."""
    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.dataset.prepare import DataSettings, prepare_dataset
    from trnqwen.dataset.report import print_report

    resolved = resolve_config(
        given(
            dataset=dataset, model=model, assets_dir=assets, seq_len=seq_len, method=method, dataset_format=dataset_format,
            dataset_split=dataset_split, packing=packing, long_conversations=long_conversations,
            train_on_inputs=train_on_inputs, val_split=val_split, val_dataset=val_dataset, seed=seed,
            answer_end=answer_end, data_cache_dir=data_cache_dir,
        ) | dict(settings or {}),
        config_file=config_file,
        uses={*DataSettings.__dataclass_fields__, *OWN_SETTINGS, "datasets", "data_cache_dir", "model", "assets_dir",
              "trust_remote_code"},
    )
    for warning in resolved.warnings:
        output.warn(warning)
    if resolved.config.data_kind == "prompts":  # the model writes the answers: the method previews its prompts
        _preview_prompts(resolved.config, json_out)
        return
    with output.work_progress("Reading and tokenizing the dataset", quiet=json_out) as report:
        prepared = prepare_dataset(resolved.config, pair_methods=registry.names_for_data("preference"), progress=report)
    if json_out:
        output.print_json({**prepared.report, "cache_dir": str(prepared.cache_dir), "reused": prepared.reused})
    elif resolved.config.data_kind == "preference":  # the method's records (trnqwen.methods.registry)
        from trnqwen.dataset.preference_report import print_pair_report

        print_pair_report(prepared, dataset=resolved.config.dataset)
    else:
        print_report(prepared, dataset=resolved.config.dataset)


def _preview_prompts(config, json_out: bool) -> None:
    from trnqwen import output
    from trnqwen.methods.base import load

    module = load(registry.get(config.method).prompts)
    report = module.preview(config, config.resolved_assets_dir)
    if json_out:
        output.print_json(report)
    else:
        module.print_preview(report)
