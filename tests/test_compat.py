"""trnqwen.titan_compat: the torchtitan API shapes.

Real sources wherever a real release has the shape: the installed 0.3.0 for the 0.3 shape, and
for the 0.2.x releases (TOML era) the two files of the 0.2.2 wheel the probe reads, copied byte
for byte into tests/data/torchtitan_0.2.2/ (sha256 in benchmarks/torchtitan_releases.md; tests
never download).  The recipe era was torchtitan's main branch between 0.2.2 and 0.3.0 and no
release on the index has its shape (benchmarks/torchtitan_releases.py checked 0.2.0-0.2.2), so it
alone is still a three-file fake package.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from trnqwen import titan_compat as compat


def _fake_package(root, *, override_sig: str, sdpa_refused: bool, chat: bool):
    pkg = root / "torchtitan"
    (pkg / "config").mkdir(parents=True)
    (pkg / "models" / "common").mkdir(parents=True)
    (pkg / "hf_datasets").mkdir(parents=True)
    (pkg / "config" / "override.py").write_text(f"def override({override_sig}):\n    pass\n")
    msg = "sdpa is no longer supported for language models" if sdpa_refused else "return SDPA()"
    (pkg / "models" / "common" / "config_utils.py").write_text(f"def get_attention_config(b):\n    '{msg}'\n")
    (pkg / "hf_datasets" / "text_datasets.py").write_text("class ChatDataLoader: pass\n" if chat else "X = 1\n")
    return pkg


def test_installed_torchtitan_is_the_03_shape():
    api = compat.detect()
    assert api.version == "0.3.0"
    assert api.era == compat.ERA_03
    assert api.attn_backend == "flex"
    assert not api.override_takes_name
    assert api.override_import_style == "function"
    assert api.hf_spmd_backend == "spmd_types"
    assert api.has_chat_dataloader
    assert not api.c4_test_in_package  # the wheel has no tests/assets/c4_test


def test_source_probe_recognises_the_recipe_shape(tmp_path):
    pkg = _fake_package(tmp_path, override_sig="name, *, target, exact=False", sdpa_refused=False, chat=False)
    facts = compat.probe_sources(pkg)
    assert facts["override_takes_name"] is True and facts["sdpa_refused"] is False
    api = compat.api_for("0.3.1", facts)  # features win over the version number
    assert api.era == compat.ERA_RECIPE
    assert api.attn_backend == "sdpa"
    assert api.override_import_style == "module"
    assert not api.has_chat_dataloader


def test_source_probe_recognises_the_03_shape_in_the_real_release():
    facts = compat.probe_sources(compat._package_dir())  # the installed torchtitan 0.3.0
    assert facts["launcher"] == "module_config" and facts["has_override_registry"] is True
    api = compat.api_for("0.3.0", facts)
    assert api.era == compat.ERA_03 and api.attn_backend == "flex" and not api.override_takes_name and api.supported


def test_real_0_2_2_sources_are_the_toml_shape_and_refused(monkeypatch):
    from pathlib import Path

    from trnqwen.errors import EnvironmentProblem

    pkg = Path(__file__).parent / "data" / "torchtitan_0.2.2" / "torchtitan"
    facts = compat.probe_sources(pkg)
    assert facts["launcher"] == "job_config_file" and facts["has_override_registry"] is False
    assert facts["has_chat_dataloader"] is False
    api = compat.api_for("0.2.2", facts)
    assert api.era == compat.ERA_TOML and not api.supported
    monkeypatch.setattr(compat, "detect", lambda: api)
    with pytest.raises(EnvironmentProblem, match="TOML job configs") as err:
        compat.require_torchtitan()
    assert "torchtitan>=0.3.0" in err.value.hint


@pytest.mark.parametrize("version,era", [
    ("0.2.2", compat.ERA_TOML), ("0.2.0", compat.ERA_TOML),  # the released 0.2.x are all TOML-era
    ("0.2.2.dev20260601", compat.ERA_RECIPE), ("0.2.1+git1a2b3c", compat.ERA_RECIPE),  # main-branch builds
    ("0.3.0", compat.ERA_03), ("0.4.0.dev1", compat.ERA_03),
])
def test_version_fallback_without_sources(version, era):
    assert compat.api_for(version).era == era


def test_override_import_syntax_per_shape():
    targets = ["trnqwen.runtime.cpu_attention.cpu_dense_attention", "json"]
    assert compat.format_override_imports(targets, compat.API_03) == ["--override.imports", *targets]
    # Recipe era names modules: the factory part is dropped, duplicates collapse.
    assert compat.format_override_imports(targets + ["trnqwen.runtime.cpu_attention.other"], compat.RECIPE_API) == [
        "--override.imports",
        "trnqwen.runtime.cpu_attention,json",
    ]
    assert compat.format_override_imports([], compat.API_03) == []


def test_bare_module_imports_expand_to_registered_overrides(tmp_path, monkeypatch):
    mod = tmp_path / "my_kernels_mod.py"
    mod.write_text(
        textwrap.dedent(
            """
            REGISTRY = None
            def register(reg):
                reg["my_kernels_mod.nki_rope"] = type("O", (), {"origin_module": "my_kernels_mod"})()
                reg["my_kernels_mod.nki_attn"] = type("O", (), {"origin_module": "my_kernels_mod"})()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: dict = {"other.mod.f": type("O", (), {"origin_module": "other.mod"})()}
    import importlib

    importlib.import_module("my_kernels_mod").register(registry)
    out = compat.expand_override_imports(["my_kernels_mod", "other.mod.f", ("my_kernels_mod", {"k": 1})], registry)
    assert out == [
        "my_kernels_mod.nki_rope",
        "my_kernels_mod.nki_attn",
        "other.mod.f",
        ("my_kernels_mod.nki_rope", {"k": 1}),
        ("my_kernels_mod.nki_attn", {"k": 1}),
    ]
    sys.modules.pop("my_kernels_mod", None)


@pytest.mark.parametrize(
    "line,name,fqn",
    [
        (
            "[rank0]:[titan] ... INFO - [Override] nki_rope: model_spec.model.layers.0.attention.rope CosSinRoPEConfig -> NKIRoPE.Config",
            "nki_rope",
            "model_spec.model.layers.0.attention.rope",
        ),
        (
            "[Override] my_module.my_factory: model_spec.model.layers.3.attention.inner_attention FlexAttention.Config -> MyAttention.Config",
            "my_module.my_factory",
            "model_spec.model.layers.3.attention.inner_attention",
        ),
    ],
)
def test_override_log_lines_of_both_shapes(line, name, fqn):
    """Both torchtitan shapes of the ``[Override]`` line are read by the log parser that runs."""
    from trnqwen.logs.patterns import parse_override_line

    parsed = parse_override_line(line)
    assert parsed is not None and parsed["name"] == name and parsed["fqn"] == fqn
    assert parse_override_line("step: 1 loss: 2") is None


def test_override_names_and_spmd_backend_per_shape():
    assert compat.override_name("my_neuron_kernels", "nki_rope", compat.RECIPE_API) == "nki_rope"
    assert compat.override_name("my_neuron_kernels", "nki_rope", compat.API_03) == "my_neuron_kernels.nki_rope"
    assert compat.spmd_backend("hf-v5", "cpu", compat.API_03) == "spmd_types"
    assert compat.spmd_backend("hf-v5", "neuron", compat.RECIPE_API) is None
    assert compat.spmd_backend("native", "cpu", compat.API_03) == "partial_dtensor"
    assert compat.spmd_backend("native", "neuron", compat.API_03) is None


def test_register_override_uses_the_installed_signature():
    calls = []

    class FakeOverride:
        def __call__(self, *args, **kwargs):
            calls.append((args, kwargs))
            return lambda fn: fn

    import torchtitan.config as tc

    real = tc.override
    try:
        tc.override = FakeOverride()
        fn = lambda cfg: cfg  # noqa: E731
        compat.register_override(fn, name="n", target=object, api=compat.RECIPE_API)
        compat.register_override(fn, name="n", target=object, api=compat.API_03)
    finally:
        tc.override = real
    assert calls[0][0] == ("n",) and calls[0][1]["target"] is object
    assert calls[1][0] == () and "name" not in calls[1][1]


def test_flavors_match_hf_configs():
    flavors = compat.native_flavors()
    assert {"0.6B", "1.7B", "4B", "8B", "14B", "32B", "30B-A3B"} <= set(flavors)
    qwen3_4b_2507 = {
        "model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151936,
        "tie_word_embeddings": True, "rope_theta": 5000000,
    }
    dims = compat.dims_from_hf_config(qwen3_4b_2507)
    assert compat.match_flavor(dims, flavors) == "4B"
    assert dims.rope_theta != flavors["4B"].rope_theta  # the 2507 release has a larger rotary base
    moe = {
        "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 1000000.0}, "norm_topk_prob": True,  # as the Hub's config.json has it
    }
    assert compat.match_flavor(compat.dims_from_hf_config(moe), flavors) == "30B-A3B"
    # transformers 5's key for the expert count reads the same
    local = {k: v for k, v in moe.items() if k != "num_experts"} | {"num_local_experts": 128}
    assert compat.match_flavor(compat.dims_from_hf_config(local), flavors) == "30B-A3B"
    # un-normalised top-k weights, or a dense layer in the mix, is another model
    assert compat.match_flavor(compat.dims_from_hf_config(dict(moe, norm_topk_prob=False)), flavors) is None
    assert compat.match_flavor(compat.dims_from_hf_config(dict(moe, mlp_only_layers=[0])), flavors) is None
    tiny = dict(qwen3_4b_2507, hidden_size=128, num_hidden_layers=4)
    assert compat.match_flavor(compat.dims_from_hf_config(tiny), flavors) is None


def test_native_flavors_are_read_without_importing_torch_in_this_process(tmp_path, monkeypatch):
    """The launcher must never import torch (a Neuron torch would claim NeuronCores)."""
    import subprocess
    import sys

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code = (
        "import sys\n"
        "from trnqwen import titan_compat as compat\n"
        "flavors = compat.native_flavors()\n"
        "assert '4B' in flavors and flavors['4B'].n_layers == 36, flavors.get('4B')\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    for _ in range(2):  # the second call is served from the on-disk cache
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert list((tmp_path / "cache" / "trnqwen").glob("qwen3-flavors-*.json"))


def test_every_torchtitan_method_trnqwen_overrides_is_still_there():
    """A torchtitan that renamed one would silently skip trnqwen's override (resume, preemption,
    LoRA export, the LR and metrics stream): each must exist, and trnqwen's classes override it."""
    import importlib

    from trnqwen.runtime import trainer, trainer_checkpoint, trainer_metrics
    from trnqwen.titan_compat import EXTENDED_03

    ours = {"Trainer": trainer.TrnqwenTrainer, "CheckpointManager": trainer_checkpoint.TrnqwenCheckpointManager,
            "MetricsProcessor": trainer_metrics.TrnqwenMetricsProcessor, "Validator": trainer.TrnqwenValidator}
    for target, methods in EXTENDED_03.items():
        module, _, name = target.partition(":")
        cls = getattr(importlib.import_module(module), name)
        for method in methods:
            assert callable(getattr(cls, method, None)), f"{target}.{method} is gone"
        if name in ours:
            overridden = [m for m in methods if any(m in vars(k) for k in ours[name].__mro__ if k not in cls.__mro__)]
            assert overridden, name
