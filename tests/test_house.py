"""The house rules the whole package keeps: no import circle between modules or sub-packages
(``../shared/tools/house_check.py``, beside the clone in CI), and no new parameter typed ``Any``.

``Any`` on a parameter is allowed where the value really is anything (a JSON value, ``*args``
passed through), a torch/transformers/torchtitan object the module does not import at load time,
or a duck-typed object; it is not a way to avoid importing a trnqwen class (import the class, under
``if TYPE_CHECKING:`` only when its module is heavy; if that import would close a circle, the
class is in the wrong module: move it, e.g. ``trnqwen/contract/``).  :data:`ALLOWED_ANY` lists
every such parameter today; a new one fails :func:`test_no_new_parameter_typed_any` until it is
typed or, with a reason, added to the list.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "trnqwen"
# CI checks the project's shared folder out beside the clone; HOUSE_CHECK names the script elsewhere.
HOUSE_CHECK = Path(os.environ.get("HOUSE_CHECK") or REPO.parent / "shared" / "tools" / "house_check.py")


def test_house_check_finds_no_circle_and_no_oversized_module():
    if not HOUSE_CHECK.is_file():
        pytest.skip(f"{HOUSE_CHECK} is absent (the shared folder beside the clone; HOUSE_CHECK=path names it)")
    run = subprocess.run([sys.executable, str(HOUSE_CHECK), str(PACKAGE)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "house ok" in run.stdout, run.stdout + run.stderr


def _any_parameters(source: str, rel: str) -> list[str]:
    """``rel:qualname:param`` for each parameter annotated ``Any`` (or ``Optional[Any]``) in ``source``."""
    found: list[str] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                for param in params:
                    if param.annotation is not None and ast.unparse(param.annotation) in ("Any", "Optional[Any]", "'Any'"):
                        found.append(f"{rel}:{name}:{param.arg}")
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")

    walk(ast.parse(source), "")
    return found


def test_no_new_parameter_typed_any():
    found = [
        entry
        for path in sorted(PACKAGE.rglob("*.py"))
        if "cli" not in path.relative_to(PACKAGE).parts[:1]
        for entry in _any_parameters(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    ]
    new = [entry for entry in found if entry not in ALLOWED_ANY]
    assert not new, (
        "parameters typed Any (type them with the real class; see this module's docstring):\n" + "\n".join(new)
    )


def test_the_any_scan_sees_a_parameter_typed_any():
    source = "class C:\n    def f(self, x: Any, y: Optional[Any] = None, *a: Any, z: dict[str, Any]) -> Any: ...\n"
    assert _any_parameters(source, "m.py") == ["m.py:C.f:x", "m.py:C.f:y", "m.py:C.f:a"]


# Every parameter typed Any today (outside cli/), by file.  Remove an entry when you type it.
ALLOWED_ANY = frozenset({
    # trnqwen/runtime/trainer*.py: torchtitan's constructor keywords, passed through as they come
    "trnqwen/runtime/trainer.py:TrnqwenValidator.__init__:kwargs",
    "trnqwen/runtime/trainer_checkpoint.py:TrnqwenCheckpointManager.__init__:kwargs",
    "trnqwen/runtime/trainer_metrics.py:TrnqwenMetricsProcessor.__init__:kwargs",
    # trnqwen/settings.py: a setting's default is of its field's type (any); the rest go to pydantic's Field
    "trnqwen/settings.py:setting:default",
    "trnqwen/settings.py:setting:field_kwargs",
    # trnqwen/settings.py: a field's annotation (a typing form: Optional[...], Literal[...], a class)
    "trnqwen/settings.py:_leaf_type:annotation",
    "trnqwen/settings.py:_sub_model:annotation",
    # trnqwen/session/training.py: the no-op hook takes whatever a hook is called with
    "trnqwen/session/training.py:_nothing:_args",
    # trnqwen/ckpt/model_folder.py
    "trnqwen/ckpt/model_folder.py:_num:value",
    # trnqwen/ckpt/verify.py
    "trnqwen/ckpt/verify.py:record_scan:report",
    # trnqwen/ckpt/verify_adapter.py
    "trnqwen/ckpt/verify_adapter.py:adapter_key_diff:peft_model",
    # trnqwen/config.py
    "trnqwen/config.py:RunConfig._home_exists:value",
    "trnqwen/config.py:RunConfig._split_imports:v",
    # trnqwen/contract/peft_adapter.py
    "trnqwen/contract/peft_adapter.py:split_fused_qkv:a",
    "trnqwen/contract/peft_adapter.py:split_fused_qkv:b",
    # trnqwen/dataset/formats.py
    "trnqwen/dataset/formats.py:_type:value",
    "trnqwen/dataset/formats.py:_text:value",
    "trnqwen/dataset/formats.py:_tool_calls:calls",
    # trnqwen/dataset/preference_formats.py
    "trnqwen/dataset/preference_formats.py:_message:raw",
    "trnqwen/dataset/preference_formats.py:_messages:raw",
    # trnqwen/dataset/prepare.py
    "trnqwen/dataset/prepare.py:DataSettings.from_config:cfg",
    "trnqwen/dataset/prepare.py:prepare_dataset:cfg",
    "trnqwen/dataset/prepare.py:_flag:value",
    "trnqwen/dataset/prepare.py:check_cache_settings:settings",
    # trnqwen/dataset/report.py
    "trnqwen/dataset/report.py:_split_rows:seq_len",
    # trnqwen/dataset/sources.py
    "trnqwen/dataset/sources.py:_check_unicode:value",
    # trnqwen/env/context.py
    "trnqwen/env/context.py:as_int:value",
    # trnqwen/evaluate/data.py
    "trnqwen/evaluate/data.py:_prepare:cache_root",
    # trnqwen/evaluate/report.py
    "trnqwen/evaluate/report.py:_num:value",
    # trnqwen/fetch/builtin.py
    "trnqwen/fetch/builtin.py:_write_json:payload",
    # trnqwen/fsutil.py
    "trnqwen/fsutil.py:write_json_atomic:payload",
    "trnqwen/fsutil.py:first_match:pattern",
    # trnqwen/logs/jsonsteps.py
    "trnqwen/logs/report.py:_num:x",  # any JSON value (was logs/jsonsteps.py)
    # trnqwen/logs/report.py
    "trnqwen/logs/report.py:write_json:obj",
    "trnqwen/logs/report.py:_fmt:x",
    # trnqwen/logs/sources.py
    "trnqwen/logs/sources.py:_pos_int:value",
    # trnqwen/output.py
    "trnqwen/output.py:print_json:payload",
    # trnqwen/quickstart/report.py
    "trnqwen/quickstart/report.py:_finite:x",
    "trnqwen/quickstart/report.py:_fmt:x",
    # trnqwen/quickstart/stages.py
    "trnqwen/quickstart/stages.py:run_config:values",
    "trnqwen/quickstart/stages.py:train_run:cfg",
    "trnqwen/quickstart/stages.py:check_override_ran:inspection",
    # trnqwen/runtime/cpu.py
    "trnqwen/runtime/cpu.py:make_cpu_device_module.memory_stats:device",
    "trnqwen/runtime/cpu.py:eager_attention_mask:args",
    "trnqwen/runtime/cpu.py:eager_attention_mask:kwargs",
    "trnqwen/runtime/cpu.py:dense_mask_from_block_mask:block_mask",
    "trnqwen/runtime/cpu.py:dense_mask_from_block_mask:device",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:module",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:query",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:key",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:value",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:attention_mask",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:s_aux",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:position_bias",
    "trnqwen/runtime/cpu.py:sdpa_flex_attention_forward:kwargs",
    # trnqwen/runtime/hf_moe_adapter.py
    "trnqwen/runtime/hf_moe_adapter.py:HFMoeStateDictAdapter.__init__:model_config",
    # trnqwen/runtime/hf_rope.py
    "trnqwen/runtime/hf_rope.py:rope_parameters_fn:module",
    "trnqwen/runtime/hf_rope.py:reinit_rotary_buffers:model",
    # trnqwen/runtime/hf_trainer_checkpoint.py
    "trnqwen/runtime/hf_trainer_checkpoint.py:dcp_checkpoint_class.DCPCheckpointTrainer.__init__:args",
    "trnqwen/runtime/hf_trainer_checkpoint.py:dcp_checkpoint_class.DCPCheckpointTrainer.__init__:kwargs",
    "trnqwen/runtime/hf_trainer_checkpoint.py:dcp_checkpoint_class.DCPCheckpointTrainer.save_model:output_dir",
    "trnqwen/runtime/hf_trainer_checkpoint.py:dcp_checkpoint_class.DCPCheckpointTrainer._load_from_checkpoint:model",
    "trnqwen/runtime/hf_trainer_checkpoint.py:dcp_checkpoint_class.DCPCheckpointTrainer._load_optimizer_and_scheduler:checkpoint",
    "trnqwen/runtime/hf_trainer_checkpoint.py:_inner_optimizer:optimizer",
    "trnqwen/runtime/hf_trainer_checkpoint.py:_state_dicts:trainer",
    # trnqwen/adapters/lora/hf_trainer.py
    "trnqwen/adapters/lora/hf_trainer.py:adapter_modules:model",
    "trnqwen/adapters/lora/hf_trainer.py:initialise:model",
    "trnqwen/adapters/lora/hf_trainer.py:attach:model",
    "trnqwen/adapters/lora/hf_trainer.py:_numel:param",
    "trnqwen/adapters/lora/hf_trainer.py:check_trainable:model",
    "trnqwen/adapters/lora/hf_trainer.py:check_trainable:optimizer",
    "trnqwen/adapters/lora/hf_trainer.py:_full:tensor",
    "trnqwen/adapters/lora/hf_trainer.py:export:model",
    "trnqwen/adapters/lora/hf_trainer.py:export:folder",
    # trnqwen/adapters/lora/titan.py
    "trnqwen/adapters/lora/titan.py:attach_lora:config",
    "trnqwen/adapters/lora/titan.py:inject_hf_adapters:model",
    "trnqwen/adapters/lora/titan.py:_add_titan_dropout:model",
    "trnqwen/adapters/lora/titan.py:freeze_base:model",
    "trnqwen/adapters/lora/titan.py:_adapter_modules:model",
    "trnqwen/adapters/lora/titan.py:_fill:param",
    "trnqwen/adapters/lora/titan.py:_fill:full",
    "trnqwen/adapters/lora/titan.py:initialise_adapters:model",
    "trnqwen/adapters/lora/titan.py:_global_numel:param",
    "trnqwen/adapters/lora/titan.py:report_trainable:optimizers",
    "trnqwen/adapters/lora/titan.py:_fused_dims:model",
    # trnqwen/runtime/override_calls.py
    "trnqwen/runtime/override_calls.py:OverrideCalls.ran:modules",
    "trnqwen/runtime/override_calls.py:OverrideCalls._after_step:optimizer",
    "trnqwen/runtime/override_calls.py:OverrideCalls._after_step:args",
    "trnqwen/runtime/override_calls.py:OverrideCalls._after_step:kwargs",
    "trnqwen/runtime/override_calls.py:ModuleCallCounter.track:module",
    "trnqwen/runtime/override_calls.py:_count:buf",
    # trnqwen/runtime/qwen3_native.py
    "trnqwen/runtime/qwen3_native.py:set_rope_theta:model_spec",
    # trnqwen/runtime/resume_state.py
    "trnqwen/runtime/resume_state.py:_RngNeutralIterable.__init__:inner",
    "trnqwen/runtime/resume_state.py:_on_signal:_frame",
    # trnqwen/runtime/titan_data.py
    "trnqwen/runtime/titan_data.py:TokenCacheDataLoader.__init__:tokenizer",
    "trnqwen/runtime/titan_data.py:TokenCacheDataLoader.__init__:kwargs",
    # trnqwen/runtime/token_stream.py
    "trnqwen/runtime/token_stream.py:read_row:split",
    # trnqwen/titan_compat.py
    "trnqwen/titan_compat.py:dims_from_model_config:model_cfg",
    # trnqwen/train/dpo.py
    "trnqwen/train/dpo.py:spec_from_config:cfg",
    "trnqwen/train/dpo.py:check:cfg",
    "trnqwen/train/dpo.py:weights_identity:cfg",
    "trnqwen/train/dpo.py:reference_key:cfg",
    "trnqwen/train/dpo.py:plan:cfg",
    "trnqwen/train/dpo.py:plan:rank_data",
    # trnqwen/train/folder_lock.py
    "trnqwen/train/folder_lock.py:FolderLock.__exit__:exc",
    # trnqwen/train/hf_trainer_recipe.py
    "trnqwen/train/hf_trainer_recipe.py:build_hf_trainer_spec:dataset",
    "trnqwen/train/hf_trainer_recipe.py:build_hf_trainer_spec:lora_spec",
    "trnqwen/train/hf_trainer_recipe.py:build_hf_trainer_spec:dpo_plan",
    # trnqwen/train/k8s.py
    "trnqwen/train/k8s.py:documents:kwargs",
    # trnqwen/train/k8s_pod.py
    "trnqwen/train/k8s_pod.py:copy:doc",
    # trnqwen/train/launcher.py
    "trnqwen/train/launcher.py:supervise.on_signal:_frame",
    # trnqwen/train/resume.py
    "trnqwen/train/resume.py:_same:a",
    "trnqwen/train/resume.py:_same:b",
    "trnqwen/train/resume.py:_show:value",
    # trnqwen/train/run.py
    "trnqwen/train/run.py:execute:status_stream",
    "trnqwen/train/run.py:_execute:status_stream",
    # trnqwen/train/schedule.py
    "trnqwen/train/schedule.py:resolve_schedule.every:value",
})
