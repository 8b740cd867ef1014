"""trnqwen check-env and the environment probe.

The CPU machine here is probed for real; the Neuron branches run against test doubles that answer
like a trn2.48xlarge (tests/doubles/neuron): a fake sysfs root, `neuron-ls`/`neuronx-cc` on PATH
and a fake `torch_neuronx` package imported by the probe's short-lived subprocess.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import pytest

from tests.doubles.neuron import CUDA_BIN, DRIVER_VERSION, GiB, neuron_host
from trnqwen.env.context import ProbeContext
from trnqwen.env.device import detect_device
from trnqwen.env.neuron import neuron_facts
from trnqwen.env.probe import probe_environment
from trnqwen.errors import EXIT_ENVIRONMENT, EnvironmentProblem
from trnqwen.env.versions import (
    check_combination,
    is_legacy_torch_neuronx,
    neuron_combo_for,
    neuron_series,
    release_tuple,
    version_matches,
)


@pytest.fixture(scope="module")
def tiny_snapshot(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("check-env") / "tiny-qwen3")


@pytest.fixture
def fetched(in_tmp, tiny_snapshot) -> Path:
    """A model where check-env looks by default (missing assets block training, issue 18 item 8)."""
    where = in_tmp / "assets" / "hf" / "Qwen3-4B-Instruct-2507"
    where.parent.mkdir(parents=True)
    where.symlink_to(tiny_snapshot, target_is_directory=True)
    return where


def _use(monkeypatch, env: dict[str, str]) -> None:
    """Point this process (and its children) at a fake host."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if "PYTHONPATH" in env:
        for entry in reversed(env["PYTHONPATH"].split(os.pathsep)):
            monkeypatch.syspath_prepend(entry)


def _json(result) -> dict:
    assert result.out.strip().startswith("{"), result.text
    return json.loads(result.out)


def _errors(report: dict) -> list[dict]:
    return [p for p in report["problems"] if p["severity"] == "error"]


# --- the real CPU machine ----------------------------------------------------------------------


def test_cpu_machine_json(cli, in_tmp, fetched):
    r = cli("check-env", "--json")
    report = _json(r)
    assert r.code == 0, report["problems"]
    assert report["device"]["type"] == "cpu" and report["device"]["count"] == 1
    assert report["packages"]["torch"] == importlib.metadata.version("torch")
    assert report["packages"]["torchtitan"] == importlib.metadata.version("torchtitan")
    assert report["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert report["packages"]["torch-neuronx"] is None
    assert report["torch"]["build"] in ("cpu", "cuda")
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    for p in report["problems"]:
        assert set(p) == {"severity", "message", "fix"} and p["severity"] in ("error", "warning", "info")
        assert p["message"] and p["fix"]
    assert not _errors(report)
    assert report["tools"]["torchrun"] and Path(report["tools"]["torchrun"]).name == "torchrun"
    assert report["paths"]["assets_dir"] == str(Path("assets/hf/Qwen3-4B-Instruct-2507"))
    assert report["paths"]["free_bytes_at_assets"] > 0
    assert report["hf"] == {"token_set": False, "hub_offline": "1"}
    assert report["ok"] is True


def test_cpu_machine_table(cli, in_tmp, fetched):
    r = cli("check-env")
    assert r.code == 0, r.text
    for word in ("Environment", "Packages", "torchtitan", "device", "cpu x 1", "Ready"):
        assert word in r.out, r.out


def test_table_shows_brackets_as_typed(cli, in_tmp, monkeypatch):
    """A fix such as pip install 'trnqwen[train]' reads the same in the table as in --json."""
    real_version = importlib.metadata.version

    def without_torchtitan(name):
        if name == "torchtitan":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", without_torchtitan)
    fix = next(p["fix"] for p in _errors(_json(cli("check-env", "--json"))) if p["message"].startswith("torchtitan"))
    assert "'trnqwen[train]'" in fix
    r = cli("check-env")
    assert r.code == 1 and "'trnqwen[train]'" in r.out and "\\[" not in r.out, r.out


def test_torch_build_is_read_without_importing_torch():
    from trnqwen.env.versions import torch_build

    info = torch_build()
    assert info["version"].split("+")[0] == importlib.metadata.version("torch")
    assert info["build"] in ("cpu", "cuda", "rocm")
    if "+cu" in info["version"]:
        assert info["build"] == "cuda" and info["cuda"]


def test_hf_token_reported_never_printed(cli, in_tmp, monkeypatch):
    secret = "hf_abcdefghijklmnopqrstuvwxyz0123"
    monkeypatch.setenv("HF_TOKEN", secret)
    r = cli("check-env", "--json")
    assert _json(r)["hf"]["token_set"] is True
    r2 = cli("check-env")
    assert secret not in r.text and secret not in r2.text
    assert "HF token set" in r2.out


def test_assets_dir_flag_and_config_file(cli, in_tmp):
    (in_tmp / "trnqwen.toml").write_text('assets_dir = "weights/q"\n')
    report = _json(cli("check-env", "--json"))
    assert report["paths"]["assets_dir"] == str(in_tmp / "weights/q")
    report = _json(cli("check-env", "--json", "--assets-dir", str(in_tmp / "elsewhere")))
    assert report["paths"]["assets_dir"] == str(in_tmp / "elsewhere")


def test_bad_config_value_is_usage_error(cli, in_tmp):
    (in_tmp / "trnqwen.toml").write_text('device = "tpu"\n')
    r = cli("check-env")
    assert r.code == 2 and "device" in r.err and "Traceback" not in r.text


def test_requested_neuron_on_cpu_machine(cli, in_tmp):
    r = cli("check-env", "--json", "--device", "neuron")
    report = _json(r)
    assert r.code == 1
    assert any("no Neuron device" in p["message"] for p in _errors(report))
    assert any("torch-neuronx not installed" in p["message"] and "--no-deps" in p["fix"] for p in _errors(report))
    with pytest.raises(EnvironmentProblem) as exc:
        detect_device("neuron")
    assert exc.value.exit_code == EXIT_ENVIRONMENT and "--device cpu" in exc.value.hint


def test_requested_cuda_without_gpu():
    with pytest.raises(EnvironmentProblem) as exc:
        detect_device("cuda")
    assert "no CUDA GPU" in exc.value.message and exc.value.hint


def test_detect_device_cpu_here():
    dev = detect_device("auto")
    assert (dev.type, dev.count) == ("cpu", 1)
    assert detect_device("cpu").count == 1


def test_cuda_count_from_nvidia_smi(monkeypatch):
    monkeypatch.setenv("PATH", f"{CUDA_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NVIDIA_GPUS", "4")
    dev = detect_device("auto")
    assert (dev.type, dev.count) == ("cuda", 4)
    assert dev.memory_bytes_per_rank == 81559 * 1024 * 1024


# --- the Neuron branches, against test doubles --------------------------------------------------


def test_trn2_lnc2_64_ranks(cli, in_tmp, fetched, tmp_path, monkeypatch):
    _use(monkeypatch, neuron_host(tmp_path))
    r = cli("check-env", "--json")
    report = _json(r)
    assert r.code == 0, _errors(report)
    d = report["device"]
    assert (d["type"], d["count"], d["lnc"]) == ("neuron", 64, 2)
    assert d["memory_bytes_per_rank"] == 24 * GiB
    assert d["instance_type"] == "trn2.48xlarge"
    assert d["peak_flops_per_rank"] == pytest.approx(157e12)
    n = report["neuron"]
    assert n["driver_version"] == DRIVER_VERSION and n["devices"] == 16 and n["physical_cores"] == 128
    assert n["compiler_version"].startswith("2.28.7631.0")
    assert n["held_by_other_processes"] == []
    assert report["packages"]["torch-neuronx"] == "2.14.3.0"
    assert report["torch"]["build"] == "neuron"
    probe = report["torch"]["torch_neuronx_probe"]
    assert probe["import_ok"] is True and probe["lnc"] == "2" and probe["platform"] == "trn2"
    # placeholder __version__ is not what we report: metadata is
    assert probe["__version__"] != report["packages"]["torch-neuronx"]

    dev = detect_device("auto")
    assert (dev.type, dev.count, dev.lnc) == ("neuron", 64, 2)
    assert dev.memory_bytes_per_rank == 24 * GiB and dev.peak_flops_per_rank == pytest.approx(157e12)
    assert detect_device("neuron").count == 64


def test_trn2_lnc1_128_ranks(cli, in_tmp, fetched, tmp_path, monkeypatch):
    _use(monkeypatch, neuron_host(tmp_path, lnc=1))
    r = cli("check-env", "--json")
    report = _json(r)
    assert r.code == 0, _errors(report)
    d = report["device"]
    assert (d["type"], d["count"], d["lnc"]) == ("neuron", 128, 1)
    assert d["memory_bytes_per_rank"] == 12 * GiB
    assert d["peak_flops_per_rank"] == pytest.approx(157e12 / 2)
    assert report["neuron"]["lnc_source"] == "env NEURON_LOGICAL_NC_CONFIG"
    assert report["torch"]["torch_neuronx_probe"]["lnc"] == "1"
    assert detect_device().count == 128


def test_cores_held_by_another_process(cli, in_tmp, tmp_path, monkeypatch):
    _use(monkeypatch, neuron_host(tmp_path, held=[(0, 113985, "python train.py"), (3, 113985, "python train.py")]))
    r = cli("check-env", "--json")
    report = _json(r)
    assert r.code == 1
    held = [p for p in _errors(report) if "held by other processes" in p["message"]]
    assert len(held) == 1
    assert "113985" in held[0]["message"] and "NeuronCore(s) not available" in held[0]["message"]
    assert "kill 113985" in held[0]["fix"]
    assert {h["neuron_device"] for h in report["neuron"]["held_by_other_processes"]} == {0, 3}
    table = cli("check-env")
    assert table.code == 1 and "113985" in table.out and "block training on neuron" in table.out


def test_driver_sees_no_devices(cli, in_tmp, fetched, tmp_path, monkeypatch):
    _use(monkeypatch, neuron_host(tmp_path, devices=False))
    r = cli("check-env", "--json")
    report = _json(r)
    assert r.code == 1
    msgs = [p["message"] for p in _errors(report)]
    assert any(f"driver {DRIVER_VERSION} is loaded but sees no devices" in m for m in msgs), msgs
    assert report["device"]["type"] == "cpu"  # auto fell back, but the report says why that is wrong
    assert detect_device("auto").type == "cpu"
    with pytest.raises(EnvironmentProblem) as exc:
        detect_device("neuron")
    assert "sees no devices" in exc.value.message and "modprobe" in exc.value.hint
    # the user explicitly chose CPU: the missing Neuron devices no longer block
    r_cpu = cli("check-env", "--json", "--device", "cpu")
    assert r_cpu.code == 0, _errors(_json(r_cpu))


def test_neuron_ls_failing(cli, in_tmp, fetched, tmp_path, monkeypatch):
    _use(monkeypatch, neuron_host(tmp_path, devices=False))
    monkeypatch.setenv("FAKE_NEURON_LS_FAIL", "ERROR: no Neuron devices found")
    r = cli("check-env", "--json")
    report = _json(r)
    assert report["neuron"]["neuron_ls_error"] == "neuron-ls --json-output failed (exit 1): ERROR: no Neuron devices found"
    # the failing tool is reported as what it means: one blocking problem with its fix, exit 1
    assert r.code == 1 and [p["message"] for p in _errors(report)] == [
        "no usable Neuron device: the Neuron driver 2.31.7.0 is loaded but sees no devices"
    ]
    assert "modprobe" in _errors(report)[0]["fix"] and "--device cpu" in _errors(report)[0]["fix"]


def test_legacy_torch_neuronx(cli, in_tmp, tmp_path, monkeypatch):
    _use(monkeypatch, neuron_host(tmp_path, legacy=True))
    r = cli("check-env", "--json")
    report = _json(r)
    assert r.code == 1
    assert report["packages"]["torch-neuronx"] == "2.9.0.2.15.1"
    assert report["torch"]["torch_neuronx_legacy"] is True
    legacy = [p for p in _errors(report) if "legacy" in p["message"]]
    series = neuron_series(neuron_combo_for(sys.version_info[:2]))  # 2.14 needs Python >= 3.12
    assert legacy and f"torch-neuronx=={series}.*" in legacy[0]["fix"] and "--no-deps" in legacy[0]["fix"]
    # the device itself is fine: 64 logical cores are still detected for the launcher
    assert report["device"]["count"] == 64


def test_sysfs_only_without_neuron_ls(tmp_path):
    env = neuron_host(tmp_path, neuron_ls=False)
    env["PATH"] = env["PATH"].split(os.pathsep)[0]  # nothing else: no real neuron-ls either
    ctx = ProbeContext.from_env(env=env)
    facts = neuron_facts(ctx)
    assert facts.neuron_ls_path is None
    assert (facts.chips, facts.physical_cores, facts.lnc, facts.logical_cores) == (16, 128, 2, 64)
    assert facts.lnc_source == "default for trn2"
    assert facts.memory_bytes_per_rank == 24 * GiB
    assert detect_device("auto", ctx=ctx).count == 64


def test_lnc_from_system_file(tmp_path):
    from tests.doubles.neuron import make_sysfs

    env = neuron_host(tmp_path, neuron_ls=False)
    make_sysfs(Path(env["TRNQWEN_SYSFS_ROOT"]), lnc_file=1)
    env["PATH"] = env["PATH"].split(os.pathsep)[0]
    facts = neuron_facts(ProbeContext.from_env(env=env))
    assert (facts.lnc, facts.logical_cores) == (1, 128)
    assert facts.lnc_source.endswith("logical_nc_config")


def test_probe_environment_explicit_roots(tmp_path, monkeypatch, tiny_snapshot):
    env = {**os.environ, **neuron_host(tmp_path)}
    monkeypatch.syspath_prepend(env["PYTHONPATH"])
    report = probe_environment(root=Path(env["TRNQWEN_SYSFS_ROOT"]), env=env, assets_dir=tiny_snapshot)
    assert report.ok and report.device["count"] == 64
    # without the model nothing trains: a blocking problem whose fix is the fetch command
    report = probe_environment(root=Path(env["TRNQWEN_SYSFS_ROOT"]), env=env, assets_dir=tmp_path / "a", model="Qwen/Qwen3-0.6B")
    assert not report.ok and [p.fix for p in report.problems if p.severity == "error"] == [
        f"fetch it: trnqwen fetch Qwen/Qwen3-0.6B --local-dir {tmp_path / 'a'}"
    ]
    assert probe_environment(
        root=Path(env["TRNQWEN_SYSFS_ROOT"]), env=env, assets_dir=tmp_path / "a", check_assets=False
    ).ok


def test_missing_torch_neuronx_on_neuron_host(cli, in_tmp, tmp_path, monkeypatch):
    _use(monkeypatch, neuron_host(tmp_path, torch_neuronx=False))
    r = cli("check-env", "--json")
    report = _json(r)
    assert r.code == 1 and report["device"]["type"] == "neuron"
    fixes = [p["fix"] for p in _errors(report) if "torch-neuronx not installed" in p["message"]]
    assert fixes and "--no-deps" in fixes[0] and "pip.repos.neuron.amazonaws.com" in fixes[0]


# --- the known-good table -----------------------------------------------------------------------


def test_version_patterns():
    assert version_matches("2.14.1+cu130", "2.14.*")
    assert version_matches("2.14.1", "2.14.1")
    assert not version_matches("2.13.0", "2.14.*")
    assert version_matches("0.2.2+neuron.1", "0.2.2+neuron.1")
    assert not version_matches("0.2.2", "0.2.2+neuron.1")
    assert release_tuple("2.9.0.2.15.1") == (2, 9, 0, 2, 15, 1)
    assert is_legacy_torch_neuronx("2.9.0.2.15.1") and is_legacy_torch_neuronx("2.5.1.2.4.0")
    assert not is_legacy_torch_neuronx("2.13.3.0") and not is_legacy_torch_neuronx("2.14.3.0")


def test_combinations():
    neuron_set = {"torch": "2.14.0", "torch-neuronx": "2.14.3.0", "torchtitan-neuron": "0.2.2+neuron.1",
                  "neuronx-cc": "2.28.7631.0"}
    ok = check_combination(neuron_set, "neuron", (3, 12))
    assert ok.ok and "2.33" in ok.best.name
    old_python = check_combination(neuron_set, "neuron", (3, 11))
    assert not old_python.ok and any("python" in m for m in old_python.mismatches)
    cpu = check_combination({"torch": "2.14.1", "torchtitan": "0.3.0", "transformers": "5.24.0"}, "cpu", (3, 11))
    assert cpu.ok
    drift = check_combination({"torch": "2.12.0", "torchtitan": "0.3.0", "transformers": "5.24.0"}, "cpu", (3, 11))
    assert drift.mismatches == ["torch 2.12.0 (wants 2.14.1)"]


def test_unknown_device_is_a_usage_error():
    from trnqwen.errors import UsageError

    with pytest.raises(UsageError):
        detect_device("tpu")


# --- issue 18 item 13: one recommendation per Python, fixes printed whole ----------------------


def test_neuron_set_recommended_follows_python():
    """torch 2.14's Neuron set needs Python >= 3.12: 3.10 and 3.11 are pointed at the 2.13 set."""
    assert neuron_series(neuron_combo_for((3, 11))) == "2.13"
    assert neuron_series(neuron_combo_for((3, 10))) == "2.13"
    assert neuron_series(neuron_combo_for((3, 12))) == "2.14"
    assert neuron_series(neuron_combo_for((3, 14))) == "2.14"


def test_missing_torch_neuronx_fix_names_the_set_for_this_python(cli, in_tmp, fetched):
    report = _json(cli("check-env", "--json", "--device", "neuron"))
    series = neuron_series(neuron_combo_for(sys.version_info[:2]))
    fix = next(p["fix"] for p in _errors(report) if "torch-neuronx not installed" in p["message"])
    assert f"torch-neuronx=={series}.*" in fix and "Python >= 3.12" in fix, fix
    combination = [p for p in report["problems"] if p["message"].startswith("untested combination")]
    # the known-good set it compares against is the same one the fix installs (never 2.13 and 2.14 at once)
    assert all(f"torch {series}" in p["message"] for p in combination), combination


def test_fixes_are_printed_whole(cli, in_tmp, fetched):
    """A fix is a command or URL to copy: never cut to a table column with an ellipsis."""
    from trnqwen.env.versions import NEURON_PIP_REPO

    r = cli("check-env", "--device", "neuron")
    assert r.code == 1
    assert "…" not in r.out, r.out
    assert f"--extra-index-url {NEURON_PIP_REPO} 'torch-neuronx==" in r.out.replace("\n", " "), r.out
