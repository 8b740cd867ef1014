"""torchtitan is extended through its own extension points, never patched (issue 33, item 3).

Walks the AST of every module under ``trnqwen/`` and fails on any assignment over an attribute of
a torchtitan *class* (``Trainer.train = ...``, ``metrics.MetricsProcessor.log = ...``, an alias
``cls = hf_backend.HFTransformerModel; cls.init_states = ...``, ``setattr(CheckpointManager, ...)``,
``del GroupedExperts._grouped_mm``), and on any swap of a torchtitan *module's* function or class
(``hf_sharding._set_layer_sharding_configs = ...``, ``setattr(loss_module, "build_cross_entropy_loss", ...)``),
outside ``runtime/cpu*.py``, the shims that make torchtitan run on a CPU at all (each patch there
carries its reason).  trnqwen's additions are subclasses chosen by torchtitan's config
(``trnqwen.runtime.trainer``) or its own classes' behaviour (``adapters/lora/titan.py``'s ``LoraLinear``
derives its adapters' sharding when torchtitan's pass sets its own) instead.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trnqwen"
EXEMPT = "runtime/cpu"  # runtime/cpu*.py: the CPU shims


def _names(tree: ast.AST) -> dict[str, str]:
    """local name -> the dotted torchtitan path it stands for (imports, then plain aliases)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torchtitan":
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        names[alias.name.split(".")[0]] = "torchtitan"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "torchtitan":
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for _ in range(3):  # aliases of aliases (cls = hf_backend.HFTransformerModel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                path = _resolve(node.value, names)
                if path is not None:
                    names.setdefault(node.targets[0].id, path)
    return names


def _resolve(node: ast.AST, names: dict[str, str]) -> Optional[str]:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        return f"{base}.{node.attr}" if base else None
    return None


@lru_cache(maxsize=None)
def _is_module_function(path: str) -> bool:
    """Whether ``path`` is a function or class held by a torchtitan module (a module attribute that
    is data, such as ``tools.utils.device_type``, is not)."""
    module, _, attr = path.rpartition(".")
    try:
        if not module or importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError, AttributeError):
        return False
    try:
        obj = getattr(importlib.import_module(module), attr)
    except Exception:
        return False  # not importable here (an optional torchtitan extra): what it holds cannot be told
    return inspect.isroutine(obj) or inspect.isclass(obj)


@lru_cache(maxsize=None)
def _is_class(path: str) -> bool:
    """Whether the torchtitan object at ``path`` is a class (imported; by its name if it cannot be)."""
    try:
        if importlib.util.find_spec(path) is not None:
            return False  # a module: module attributes are not class attributes
    except (ImportError, ValueError, AttributeError):
        pass
    obj = None
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            obj = None
        break
    if obj is None:
        return parts[-1][:1].isupper()
    return inspect.isclass(obj)


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _flatten(target)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        yield from _flatten(node.target)
    elif isinstance(node, ast.Delete):
        for target in node.targets:
            yield from _flatten(target)


def _flatten(target: ast.AST) -> Iterator[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _flatten(elt)
    else:
        yield target


def titan_class_patches(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: Class.attr`` for each assignment over a torchtitan class attribute in ``source``."""
    return [hit for kind, hit in titan_patches(source, filename) if kind == "class"]


def titan_patches(source: str, filename: str = "<source>") -> list[tuple[str, str]]:
    """``(kind, "file:line: path.attr")`` for each assignment over a torchtitan class attribute
    (kind ``class``) or a torchtitan module's function or class (kind ``module``) in ``source``."""
    tree = ast.parse(source, filename)
    names = _names(tree)
    found = []
    for node in ast.walk(tree):
        bases: list[tuple[ast.AST, str]] = []
        for target in _targets(node):
            if isinstance(target, ast.Attribute):
                bases.append((target.value, target.attr))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and node.args):
            attr = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "?"
            bases.append((node.args[0], str(attr)))
        for base, attr in bases:
            path = _resolve(base, names)
            if path is None:
                continue
            if _is_class(path):
                found.append((node.lineno, "class", f"{filename}:{node.lineno}: {path}.{attr}"))
            elif _is_module_function(f"{path}.{attr}"):
                found.append((node.lineno, "module", f"{filename}:{node.lineno}: {path}.{attr}"))
    return [(kind, hit) for _line, kind, hit in sorted(found)]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not p.relative_to(PACKAGE).as_posix().startswith(EXEMPT))


def test_no_module_assigns_over_a_torchtitan_class_or_swaps_a_module_function():
    found = [hit for path in _modules()
             for _kind, hit in titan_patches(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, (
        "patches of torchtitan (extend it through its config instead: a subclass in trnqwen.runtime.trainer*, "
        "a trainer hook, trnqwen's own classes; CPU-only shims go to runtime/cpu*.py with their reason):\n"
        + "\n".join(found)
    )


SAMPLE = '''
from torchtitan.trainer import Trainer
from torchtitan.components import metrics
from torchtitan.components.checkpointer.dcp import CheckpointManager as CM
import torchtitan.components.validate as validate
from torchtitan.tools import utils as tt_utils
from torchtitan.experiments.transformers_modeling_backend import model as hf_backend
from torchtitan.experiments.transformers_modeling_backend import hf_sharding

def install():
    Trainer.train = lambda self: None                    # 1 a class
    metrics.MetricsProcessor.log = None                  # 2 a class through its module
    CM._load = None                                      # 3 an alias of the import
    validate.Validator.post_dataloading_process = None   # 4 import ... as
    cls = hf_backend.HFTransformerModel
    cls.init_states = None                               # 5 a local alias
    setattr(Trainer, "batch_generator", None)            # 6 setattr
    del CM.dcp_save                                      # 7 del
    tt_utils.device_type = "cpu"                         # a module's data: not a patch
    hf_sharding._set_layer_sharding_configs = None       # 8 a module's function swapped
    setattr(hf_sharding, "set_hf_sharding_configs", None)  # 9 the same by setattr
    trainer = object()
    trainer.step = 3                                     # an instance: not a class patch
    Trainer.train.__doc__  # reading is fine
'''


def test_the_check_finds_each_kind_of_patch():
    swaps = [hit.rsplit(" ", 1)[1] for kind, hit in titan_patches(SAMPLE) if kind == "module"]
    assert swaps == [
        "torchtitan.experiments.transformers_modeling_backend.hf_sharding._set_layer_sharding_configs",
        "torchtitan.experiments.transformers_modeling_backend.hf_sharding.set_hf_sharding_configs",
    ], swaps
    found = titan_class_patches(SAMPLE)
    attrs = [hit.rsplit(" ", 1)[1] for hit in found]
    assert attrs == [
        "torchtitan.trainer.Trainer.train",
        "torchtitan.components.metrics.MetricsProcessor.log",
        "torchtitan.components.checkpointer.dcp.CheckpointManager._load",
        "torchtitan.components.validate.Validator.post_dataloading_process",
        "torchtitan.experiments.transformers_modeling_backend.model.HFTransformerModel.init_states",
        "torchtitan.trainer.Trainer.batch_generator",
        "torchtitan.components.checkpointer.dcp.CheckpointManager.dcp_save",
    ], found


# The patches trnqwen had before it extended torchtitan through its config (commit 55387f7).
BEFORE = "55387f7"
PATCHED_BEFORE = {
    "trnqwen/runtime/resume_state.py": 6, "trnqwen/runtime/lr_log.py": 1, "trnqwen/runtime/dpo.py": 5,
    "trnqwen/runtime/lora.py": 2, "trnqwen/runtime/entry.py": 1, "trnqwen/runtime/qwen3_native.py": 1,
    "trnqwen/runtime/hf_rope.py": 1,
}


def test_the_check_fails_on_the_code_before_the_change():
    try:
        sources = {path: subprocess.run(["git", "show", f"{BEFORE}:{path}"], cwd=ROOT, capture_output=True,
                                        text=True, check=True).stdout for path in PATCHED_BEFORE}
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"no git history with {BEFORE} here")
    counts = {path: len(titan_class_patches(text, path)) for path, text in sources.items()}
    assert counts == PATCHED_BEFORE


# runtime/lora.py swapped torchtitan's hf_sharding._set_layer_sharding_configs while the Transformers
# backend parallelized (main before the change that made LoraLinear derive its adapters' sharding).
SWAPPED_BEFORE = "740c8ed"


def test_the_check_fails_on_the_lora_module_function_swap_it_replaced():
    try:
        text = subprocess.run(["git", "show", f"{SWAPPED_BEFORE}:trnqwen/runtime/lora.py"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"no git history with {SWAPPED_BEFORE} here")
    hits = [hit for kind, hit in titan_patches(text, "lora.py") if kind == "module"]
    assert len(hits) == 1 and hits[0].endswith("hf_sharding._set_layer_sharding_configs"), hits
