"""One-off check: trnqwen.titan_compat against the torchtitan releases on the package index.

Downloads each release's wheel with ``pip download --no-deps`` into a temporary directory (or
reads wheels from ``--wheels``), unpacks it, and reports, from the real source files:

* what ``compat.probe_sources`` / ``compat.api_for`` detect (the API shape trnqwen would use),
* whether the things trnqwen's generated config module needs exist: the override registry
  (``torchtitan/config/override.py``), the ``--module/--config`` launcher (``config/manager.py``),
  the Qwen3 config registry, ``model_registry``, the Transformers modeling backend,
* the log lines ``inspect-logs`` reads for the model's identity (``Starting job:``, the
  ``Building <name> <flavor>with {model args}`` line, ``Model <name> <flavor> size:``).

The installed torchtitan (0.3.0 here) is reported next to them from the venv.  The output is
committed as benchmarks/torchtitan_releases.md; docs/versions.md summarises it.  Nothing here runs
in the test suite (tests never download): tests/data/torchtitan_0.2.2/ holds the two source files
of the 0.2.2 wheel that the probe reads, byte for byte, with their sha256 in that output.

A release whose wheel cannot be downloaded (no package index) is reported as such, in the table,
on stderr and in the ``--json`` summary (``download_failed``), never invented; the installed
release is still read.  ``benchmarks/run_all.py --quick`` runs one release with ``--no-write``.

  python benchmarks/torchtitan_releases.py [--versions 0.2.0 0.2.1 0.2.2] [--wheels DIR] [--out FILE]
                                           [--no-write] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trnqwen import titan_compat as compat  # noqa: E402

VERSIONS = ("0.2.0", "0.2.1", "0.2.2")


class DownloadFailed(Exception):
    """pip could not fetch a release's wheel (no package index, no such release)."""


def _wheel(version: str, wheels: Path) -> Path:
    found = sorted(wheels.glob(f"torchtitan-{version}-*.whl"))
    if found:
        return found[0]
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"torchtitan=={version}",
                               "-d", str(wheels)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise DownloadFailed("pip download timed out after 300 s") from None
    found = sorted(wheels.glob(f"torchtitan-{version}-*.whl"))
    if proc.returncode or not found:
        last = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if not line.startswith("WARNING")]
        raise DownloadFailed(f"pip download exited {proc.returncode}: {(last or ['no output'])[-1][:200]}")
    return found[0]


def _module_file(pkg: Path, dotted: str) -> bool:
    rel = dotted.split(".", 1)[1].replace(".", "/") if "." in dotted else ""
    return (pkg / f"{rel}.py").is_file() or (pkg / rel / "__init__.py").is_file()


def facts_for(pkg: Path, version: str) -> dict:
    probe = compat.probe_sources(pkg)
    api = compat.api_for(version, probe)
    train = (pkg / "train.py").read_text(errors="replace") if (pkg / "train.py").is_file() else ""
    trainer = (pkg / "trainer.py").read_text(errors="replace") if (pkg / "trainer.py").is_file() else ""
    qwen3_init = pkg / "models" / "qwen3" / "__init__.py"
    flavors = sorted(set(re.findall(r'^\s*"(\d+(?:\.\d+)?B(?:-A\d+B)?|debugmodel\w*)":', qwen3_init.read_text(errors="replace"), re.M))) if qwen3_init.is_file() else []
    source = train + trainer
    return {
        "version": version,
        "probe": probe,
        "era": api.era,
        "supported": api.supported,
        "override_registry": (pkg / "config" / "override.py").is_file(),
        "module_config_launcher": probe.get("launcher") == "module_config",
        "job_config_file_launcher": probe.get("launcher") == "job_config_file",
        "qwen3_config_registry": _module_file(pkg, api.qwen3_config_registry if api.supported else compat.API_03.qwen3_config_registry),
        "model_registry": "def model_registry" in qwen3_init.read_text(errors="replace") if qwen3_init.is_file() else False,
        "transformers_backend": (pkg / "experiments" / "transformers_modeling_backend").is_dir(),
        "qwen3_flavors": flavors,
        "starting_job_line": "Starting job:" in source,
        "building_with_args_line": bool(re.search(r'Building \{job_config\.model\.name\} \{job_config\.model\.flavor\}"\s*f?"with', source)),
        "model_size_line": "size: {model_param_count:,} total parameters" in source,
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def render(rows: list[dict], vendored: dict[str, str], failed: Optional[dict[str, str]] = None) -> str:
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    out = [
        "# torchtitan releases against trnqwen.titan_compat",
        "",
        "Written by `python benchmarks/torchtitan_releases.py` (wheels from the package index, `pip download --no-deps`;",
        "the installed 0.3.0 read from the venv).  Every fact is read from the release's own source files.",
        "",
        "| | " + " | ".join(r["version"] for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for label, key in (
        ("API shape detected (compat.detect)", "era"),
        ("trnqwen can drive it", "supported"),
        ("override registry (`torchtitan/config/override.py`)", "override_registry"),
        ("`--module/--config` launcher", "module_config_launcher"),
        ("`--job.config_file` TOML launcher", "job_config_file_launcher"),
        ("`model_registry` in `models/qwen3`", "model_registry"),
        ("Transformers modeling backend (`experiments/transformers_modeling_backend`)", "transformers_backend"),
        ("log: `Starting job: <description>`", "starting_job_line"),
        ("log: `Building <name> <flavor>with {model args JSON}`", "building_with_args_line"),
        ("log: `Model <name> <flavor> size: N total parameters`", "model_size_line"),
    ):
        cells = [r[key] if isinstance(r[key], str) else yes(r[key]) for r in rows]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("| Qwen3 flavors | " + " | ".join(", ".join(r["qwen3_flavors"]) or "-" for r in rows) + " |")
    if failed:
        out += ["", "Not read (the wheel could not be downloaded):", ""]
        out += [f"- {version}: {why}" for version, why in failed.items()]
    out += ["", "Source probe facts (`compat.probe_sources`):", ""]
    out += [f"- {r['version']}: `{r['probe']}`" for r in rows]
    if vendored:
        out += ["", "Files copied byte for byte into tests/data/torchtitan_0.2.2/ (sha256):", ""]
        out += [f"- `{name}`: {digest}" for name, digest in vendored.items()]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="+", default=list(VERSIONS))
    ap.add_argument("--wheels", type=Path, help="a directory with the wheels (else downloaded to a temp dir)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "torchtitan_releases.md")
    ap.add_argument("--no-write", action="store_true", help="print the table, do not write --out")
    ap.add_argument("--json", action="store_true", help="end with a one-line JSON summary")
    args = ap.parse_args()
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="trnqwen-tt-") as tmp:
        wheels = args.wheels or Path(tmp)
        rows = []
        vendored: dict[str, str] = {}
        for version in args.versions:
            try:
                whl = _wheel(version, wheels)
            except DownloadFailed as exc:
                failed[version] = str(exc)
                print(f"torchtitan_releases: torchtitan {version} not read: {exc} (is the package index reachable?)",
                      file=sys.stderr)
                continue
            dest = Path(tmp) / f"x-{version}"
            with zipfile.ZipFile(whl) as z:
                z.extractall(dest)
            rows.append(facts_for(dest / "torchtitan", version))
            if version == "0.2.2":
                for rel in ("torchtitan/config/manager.py", "torchtitan/hf_datasets/text_datasets.py"):
                    vendored[rel] = _sha(dest / rel)
        installed = compat._package_dir()
        installed_row = facts_for(installed, compat.installed_version() or "?") if installed is not None else None
        if installed_row is not None:
            rows.append(installed_row)
    text = render(rows, vendored, failed)
    if not args.no_write:
        args.out.write_text(text)
    if args.json:
        brief = lambda r: {"era": r["era"], "supported": r["supported"], "launcher": r["probe"].get("launcher")}  # noqa: E731
        print(json.dumps({"benchmark": "torchtitan_releases",
                          "releases": {r["version"]: brief(r) for r in rows if r is not installed_row},
                          "installed": brief(installed_row) | {"version": installed_row["version"]} if installed_row else None,
                          "download_failed": failed}))
    else:
        print(text)
    return 0 if installed_row is not None else 1


if __name__ == "__main__":
    sys.exit(main())
