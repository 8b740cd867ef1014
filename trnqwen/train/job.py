"""The contract between recipes (what to run) and the launcher (how to run it).

A recipe turns a resolved :class:`~trnqwen.config.RunConfig` plus the detected device into a
:class:`TrainJob`; the launcher turns a TrainJob into a torchrun command, a run directory and a
supervised process group.  Neither side knows the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from trnqwen.train.schedule import Schedule


@dataclass
class TrainJob:
    backend: str
    # What torchrun runs: ``-m <entry_module> <entry_args...>``.  For torchtitan backends the
    # entry is trnqwen's rank entry point (device shims, then torchtitan.train) or torchtitan.train.
    entry_module: str
    entry_args: list[str] = field(default_factory=list)
    # A generated torchtitan config module (written into the run dir as ``<config_module>.py``
    # and put on PYTHONPATH); ``--module <config_module> --config <config_fn>`` selects it.
    config_module: Optional[str] = None
    config_fn: Optional[str] = None
    config_module_text: Optional[str] = None
    # Environment the ranks need (device selection, caches); merged over os.environ.
    env: dict[str, str] = field(default_factory=dict)
    # Where the HF export of the last step will be (``<dir>/step-N/``); None when not exporting.
    checkpoint_dir: Optional[Path] = None
    # Model facts for preflight and log judging.
    num_layers: Optional[int] = None
    num_params: Optional[int] = None
    vocab_size: Optional[int] = None
    notes: list[str] = field(default_factory=list)
    # --- added by the recipes side (all optional; the launcher may ignore them) ---------------
    # Ranks per node and in total as the recipe planned them (nproc_per_node x nnodes).
    nproc_per_node: Optional[int] = None
    world_size: Optional[int] = None
    # Sequences per optimizer step over all ranks (local batch x data-parallel degree by default).
    global_batch_size: Optional[int] = None
    # torchtitan's dump_folder (the run dir): structured logs, comm traces.
    dump_folder: Optional[Path] = None
    # native/nki-moe: the registered torchtitan flavor ("4B", "30B-A3B"), or "config.json" when the
    # model config was built from the checkpoint's config.json.
    model_flavor: Optional[str] = None
    # User override imports as given; entry_args already carry them as --override.imports in the
    # installed torchtitan's syntax (the launcher must not add them again).
    override_imports: list[str] = field(default_factory=list)
    # What the data is (a path, a Hub name or a torchtitan dataset name), for messages.
    dataset: Optional[str] = None
    # The tokenized cache every rank reads (trnqwen.dataset), when the run reads one.
    dataset_cache: Optional[Path] = None
    # Steps, LR curve, optimizer (trnqwen.train.schedule.Schedule): resolved once, the same on every backend.
    schedule: Optional[Schedule] = None
