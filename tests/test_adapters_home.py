"""An adapter is a folder (``trnqwen/adapters/<name>/``, issue 33), between ``runtime/`` and ``methods/``:

* ``runtime/`` never imports ``trnqwen.adapters``: the generated torchtitan config module imports the
  adapter's code and trainer hook, and the hf-trainer spec names its module (``lora_module``);
* an adapter imports only the base modules, ``contract/`` and ``runtime/`` (what it needs from a layer
  above, the merge child, the quickstart's ``StageFailed``, is handed in);
* LoRA's own code is in its folder: no module of its old homes is left.

``house_check.py`` finds circles; these find an arrow that points the wrong way before it closes one.
"""

from __future__ import annotations

import ast

from tests.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "trnqwen"
# the layers an adapter may import (besides the base modules: trnqwen.<module> that is not a package)
ADAPTER_MAY_IMPORT = ("contract", "runtime", "adapters")


def _imports(path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return [name for name in out if name == "trnqwen" or name.startswith("trnqwen.")]


def _packages() -> set[str]:
    return {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def test_runtime_never_imports_an_adapter():
    found = {str(p.relative_to(REPO_ROOT)): names for p in sorted((PACKAGE / "runtime").rglob("*.py"))
             if (names := [n for n in _imports(p) if n.startswith("trnqwen.adapters")])}
    assert not found, f"runtime/ imports an adapter (pass a trainer hook or name it in the spec): {found}"


def test_an_adapter_imports_only_the_layers_below_it():
    packages = _packages()
    found: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "adapters").rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            layer = parts[1] if len(parts) > 1 else ""
            if layer in packages and layer not in ADAPTER_MAY_IMPORT:
                found.setdefault(str(path.relative_to(REPO_ROOT)), []).append(name)
    assert not found, f"an adapter imports a layer above it (hand the piece in instead): {found}"


def test_loras_own_code_has_left_its_old_homes():
    old = ["train/lora.py", "runtime/lora.py", "runtime/hf_trainer_lora.py", "logs/lora.py", "quickstart/lora_stage.py"]
    assert not [p for p in old if (PACKAGE / p).exists()]
    assert {p.name for p in (PACKAGE / "adapters" / "lora").glob("*.py")} >= {
        "__init__.py", "plan.py", "titan.py", "hf_trainer.py", "readers.py", "quickstart.py"}


def test_the_scan_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("from trnqwen.logs.record import ParsedLog\nimport trnqwen.ckpt.merge\nfrom . import x\n")
    assert _imports(bad) == ["trnqwen.logs.record", "trnqwen.logs.record.ParsedLog", "trnqwen.ckpt.merge"]
