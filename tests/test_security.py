"""Security properties, checked on the source and by running the code:

* no pickle is ever unpickled: the package never calls ``pickle.load``/``torch.load`` without
  ``weights_only=True``, and every ``from_pretrained`` of weights asks for safetensors only;
* remote code stays off unless asked: every ``from_pretrained``/``from_config`` passes
  ``trust_remote_code`` through from the config (never a literal True), the config default is
  False, and a repo shipping its own code does not get it run by ``verify-ckpt --round-trip``
  (and does with ``--trust-remote-code``, which proves the test can fail);
* Hub file names are checked against path traversal before anything is written;
* run records, logs and every other file trnqwen writes follow the user's umask.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, run_subprocess

SOURCES = sorted(
    p for root in ("trnqwen", "examples", "benchmarks") for p in (REPO_ROOT / root).rglob("*.py")
    if "_work" not in p.parts
)
UNPICKLERS = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("cPickle", "load"),
              ("dill", "load"), ("dill", "loads"), ("joblib", "load"), ("cloudpickle", "load"),
              ("cloudpickle", "loads"), ("_pickle", "load")}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                owner = f.value.id if isinstance(f.value, ast.Name) else (
                    f.value.attr if isinstance(f.value, ast.Attribute) else None)
                yield owner, f.attr, node
            elif isinstance(f, ast.Name):
                yield None, f.id, node


def _kw(node: ast.Call, name: str):
    for kw in node.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _has_kwargs_splat(node: ast.Call) -> bool:
    return any(kw.arg is None for kw in node.keywords)


def _parsed():
    for path in SOURCES:
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_the_scan_sees_the_package():
    names = {p.relative_to(REPO_ROOT).as_posix() for p in SOURCES}
    assert "trnqwen/ckpt/generate.py" in names and "trnqwen/fetch/download.py" in names


def test_no_unpickling_anywhere_in_the_source():
    offenders = []
    for path, tree in _parsed():
        for owner, attr, node in _calls(tree):
            where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
            if (owner, attr) in UNPICKLERS:
                offenders.append(f"{where} {owner}.{attr}")
            if owner == "torch" and attr == "load":
                wo = _kw(node, "weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    offenders.append(f"{where} torch.load without weights_only=True")
            if attr == "load" and owner in ("np", "numpy"):
                ap = _kw(node, "allow_pickle")
                if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
                    offenders.append(f"{where} numpy.load with allow_pickle")
    assert offenders == []


def test_weights_are_loaded_from_safetensors_only():
    """Every ``AutoModel*.from_pretrained`` asks for safetensors (a .bin beside it is never read)."""
    offenders, seen = [], 0
    for path, tree in _parsed():
        for owner, attr, node in _calls(tree):
            if attr == "from_pretrained" and owner and owner.startswith("AutoModel"):
                seen += 1
                if _has_kwargs_splat(node):
                    # the kwargs dict is built just above the call: it must say so there
                    src = path.read_text(encoding="utf-8").splitlines()
                    window = "\n".join(src[max(0, node.lineno - 20): node.lineno])
                    if '"use_safetensors": True' not in window:
                        offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
                    continue
                us = _kw(node, "use_safetensors")
                if not (isinstance(us, ast.Constant) and us.value is True):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert seen >= 2 and offenders == []


def test_trust_remote_code_is_passed_through_never_hard_coded_on():
    offenders, seen = [], 0
    for path, tree in _parsed():
        for owner, attr, node in _calls(tree):
            if attr not in ("from_pretrained", "from_config") or not owner or not owner.startswith("Auto"):
                continue
            seen += 1
            where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
            trc = _kw(node, "trust_remote_code")
            if trc is None and not _has_kwargs_splat(node):
                offenders.append(f"{where} no trust_remote_code (transformers' default may change)")
            if isinstance(trc, ast.Constant) and trc.value is True:
                offenders.append(f"{where} trust_remote_code=True")
    assert seen >= 5 and offenders == []
    from trnqwen.config import RunConfig

    assert RunConfig().trust_remote_code is False


def test_pickle_checkpoints_are_refused_not_loaded(cli, tmp_path):
    marker = tmp_path / "pwned"
    payload = tmp_path / "ckpt"
    payload.mkdir()
    # A real malicious pickle: unpickling it would create the marker file.
    import pickle

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (payload / "pytorch_model.bin").write_bytes(pickle.dumps(Boom()))
    r = cli("verify-ckpt", str(payload))
    assert r.code == 1 and "does not unpickle" in r.err and "Traceback" not in r.text
    r = cli("verify-ckpt", str(payload / "pytorch_model.bin"))
    assert r.code == 1 and "does not unpickle" in r.err
    assert not marker.exists()


EVIL_CODE = '''
from pathlib import Path
Path(MARKER).write_text("yes")
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config


class EvilConfig(Qwen3Config):
    model_type = "qwen3"
'''


@pytest.fixture(scope="module")
def repo_with_code(tmp_path_factory) -> Path:
    """The tiny model's files plus a config.json whose auto_map points at code in the folder."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    folder = write_tiny_qwen3(tmp_path_factory.mktemp("remote-code") / "tiny")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil_config.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "evil_config.py").write_text(EVIL_CODE.replace("MARKER", repr(str(folder / "REMOTE_CODE_RAN"))))
    return folder


@pytest.mark.slow
def test_remote_code_runs_only_when_asked(repo_with_code, tmp_path):
    marker = repo_with_code / "REMOTE_CODE_RAN"
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    r = run_subprocess("verify-ckpt", str(repo_with_code), "--round-trip", "--json", env=env, cwd=tmp_path)
    assert r.code == 0, r.text
    assert not marker.exists(), "the repo's own code ran without --trust-remote-code"
    # the flag is honoured (so the check above can fail)
    r = run_subprocess("verify-ckpt", str(repo_with_code), "--round-trip", "--trust-remote-code", "--json",
                       env=env, cwd=tmp_path)
    assert marker.exists(), r.text
    assert "Traceback" not in r.text and "internal error" not in r.text


@pytest.mark.parametrize("name", ["sub/../../x.json", "C:evil.json", "a\\..\\b.json", "./config.json", "dir/",
                                  "/etc/passwd", "..", "x\0.json", "ok/\n.json"])
def test_hub_names_that_escape_are_refused(name):
    from trnqwen.errors import CheckFailed
    from trnqwen.fetch.plan import check_repo_path

    with pytest.raises(CheckFailed, match="escape"):
        check_repo_path(name)


# --- umask ---------------------------------------------------------------------------------------------


@pytest.fixture
def umask_077():
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _loose(root: Path) -> list[str]:
    """Files or folders readable/writable by group or others."""
    out = []
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        mode = stat.S_IMODE(p.stat().st_mode)
        if mode & 0o077:
            out.append(f"{p.relative_to(root)} {oct(mode)}")
    return out


def test_run_dir_record_log_and_script_follow_the_umask(tmp_path, umask_077):
    """A real execute(): run dir, run.json, train.log, command.sh, config module, LAST."""
    from trnqwen.config import RunConfig
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.job import TrainJob
    from trnqwen.train.preflight import PreflightReport
    from trnqwen.train.plan import TrainPlan
    from trnqwen.train.run import execute
    from trnqwen.contract.topology import topology

    runs = tmp_path / "runs"
    cfg = RunConfig(model="builtin:tiny-qwen3", device="cpu", steps=1, runs_dir=runs)
    job = TrainJob(backend="native", entry_module="x", config_module="cfg_mod", config_fn="f",
                   config_module_text="def f():\n    return None\n")
    argv = [sys.executable, "-c", "print('[titan] INFO - step:  1  loss:  2.50000  grad_norm: 1.0  tps: 10')"]
    plan = TrainPlan(config=cfg, device=DeviceInfo(type="cpu", count=1), job=job, topology=topology(nproc_per_node=1), run_id="r1",
                     run_dir=runs / "r1", argv=argv, env={}, preflight=PreflightReport(), cwd=tmp_path)
    outcome = execute(plan, status=False)
    assert outcome.exit_code == 0, outcome.as_dict()
    for name in ("run.json", "train.log", "command.sh", "cfg_mod.py"):
        assert (runs / "r1" / name).is_file(), name
    assert os.access(runs / "r1" / "command.sh", os.X_OK)
    assert _loose(runs) == []


def test_fetched_snapshot_and_inspect_logs_outputs_follow_the_umask(cli, tmp_path, umask_077):
    dest = tmp_path / "tiny"
    assert cli("fetch", "builtin:tiny-qwen3", "--local-dir", str(dest)).code == 0
    assert _loose(dest) == []
    log = REPO_ROOT / "tests" / "data" / "logs" / "real_native_tiny_2ranks_finetune.log"
    out = tmp_path / "out"
    out.mkdir()
    r = cli("inspect-logs", str(log), "--csv", str(out / "steps.csv"), "--plot", str(out / "loss.png"))
    assert r.code == 0, r.text
    assert {p.name for p in out.iterdir()} == {"steps.csv", "loss.png"}
    assert _loose(out) == []
