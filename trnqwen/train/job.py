"""The contract between recipes (what to run) and the launcher (how to run it).

A recipe turns a resolved :class:`~trnqwen.config.RunConfig` plus the detected device into a
:class:`TrainJob`; the launcher turns a TrainJob into a torchrun command, a run directory and a
supervised process group.  Neither side knows the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


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
