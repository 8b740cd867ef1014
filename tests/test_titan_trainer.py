"""trnqwen's torchtitan classes are chosen by the config, and torchtitan's own parsing keeps them.

The generated config module returns ``trnqwen_config(config, hooks=[...])``; torchtitan's
ConfigManager loads it with ``--module/--config`` and tyro parses CLI overrides into that config's
own class, so trnqwen's Trainer, checkpointer, metrics processor and validator are what
``config.build()`` makes, for the native config and for the Transformers backend's.  (What they do
is pinned by the end-to-end tests: resume, preemption, DPO, LoRA, the metrics stream.)
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

MODULE = """
from torchtitan.models.qwen3.config_registry import qwen3_debugmodel
from torchtitan.experiments.transformers_modeling_backend.config_registry import transformers_modeling_backend_full
from trnqwen.runtime.trainer import TrainerHook, trnqwen_config


class Hook(TrainerHook):
    name = "probe"


def native():
    return trnqwen_config(qwen3_debugmodel(), hooks=[Hook()], backend="native")


def hf():
    config = transformers_modeling_backend_full()
    config.hf_model = "somewhere"
    return trnqwen_config(config, hooks=[Hook()], backend="hf-v5")
"""


@pytest.fixture()
def config_module(tmp_path, monkeypatch):
    (tmp_path / "trnqwen_probe_cfg.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "trnqwen_probe_cfg"
    sys.modules.pop("trnqwen_probe_cfg", None)


def _parse(module: str, fn: str, *flags: str):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--module", module, "--config", fn, *flags])


@pytest.mark.parametrize("fn", ["native", "hf"])
def test_module_config_loading_and_cli_overrides_keep_trnqwens_classes(config_module, fn):
    from torchtitan.trainer import Trainer

    from trnqwen.runtime.trainer import TrnqwenTrainerMixin, TrnqwenValidator
    from trnqwen.runtime.trainer_checkpoint import TrnqwenCheckpointManager
    from trnqwen.runtime.trainer_metrics import TrnqwenMetricsProcessor

    config = _parse(config_module, fn, "--training.steps", "7", "--checkpoint.interval", "3",
                    "--metrics.log_freq", "2", "--validator.freq", "5")
    assert issubclass(config._owner, TrnqwenTrainerMixin) and issubclass(config._owner, Trainer)
    assert (config.training.steps, config.checkpoint.interval, config.metrics.log_freq, config.validator.freq) == (7, 3, 2, 5)
    assert type(config.checkpoint) is TrnqwenCheckpointManager.Config
    assert type(config.metrics) is TrnqwenMetricsProcessor.Config
    assert type(config.validator) is TrnqwenValidator.Config
    assert [type(h).__name__ for h in config.hooks] == ["Hook"]
    assert config.metrics.backend == {"native": "native", "hf": "hf-v5"}[fn]  # kept through the parse
    if fn == "hf":
        from torchtitan.experiments.transformers_modeling_backend.trainer import HFTransformerTrainer

        assert issubclass(config._owner, HFTransformerTrainer) and config.hf_model == "somewhere"
    json.dumps(config.to_dict())  # torchtitan prints it and hands it to W&B: the hooks too


def test_adopting_twice_keeps_one_class_and_adds_hooks(config_module):
    import importlib

    from trnqwen.runtime.trainer import TrainerHook, trnqwen_config

    config = importlib.import_module(config_module).native()
    again = trnqwen_config(config, hooks=[TrainerHook()])
    assert again is config and len(again.hooks) == 2


def test_the_hook_order_is_written_down_once():
    from trnqwen.runtime import trainer

    text = "\n".join(trainer.HOOK_ORDER)
    for what in ("override imports", "rotary", "[MoE]", "after_checkpoint_load", "on_batch", "lr:",
                 "metrics-stream", "preemption", "LoRA", "validation"):
        assert what in text, what


BUILD = """
import json, sys
from trnqwen.runtime.cpu import install_cpu_device
install_cpu_device()
from torchtitan.config import ConfigManager
from torchtitan.distributed import ParallelDims

config = ConfigManager().parse_args(["--module", sys.argv[1], "--config", sys.argv[2]])
processor = config.metrics.build(parallel_dims=ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1,
                                                            world_size=1), dump_folder=sys.argv[3])
processor.log_validation(1.5, 3)
processor.close()
"""


@pytest.mark.parametrize("fn, backend", [("native", "native"), ("hf", "hf-v5")])
def test_the_metrics_streams_header_names_the_runs_backend(config_module, tmp_path, fn, backend):
    """trnqwen's metrics processor, built by torchtitan from the parsed config (in a process of its
    own: the CPU device is torchtitan-global), writes the header with the backend the module names."""
    import os
    import subprocess

    from trnqwen.contract.metrics_stream import PATH_ENV, read_stream

    stream = tmp_path / "metrics.jsonl"
    env = {**os.environ, PATH_ENV: str(stream), "RANK": "0",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    run = subprocess.run([sys.executable, "-c", BUILD, config_module, fn, str(tmp_path / "dump")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    header, validation = read_stream(stream)
    assert header.kind == "header" and header.meta["backend"] == backend and header.meta["method"] == "sft"
    assert validation.kind == "validation" and validation.values["loss"] == 1.5
