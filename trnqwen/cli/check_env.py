"""``trnqwen check-env``: is this machine ready to train, and if not, what to do.

Examples:
  trnqwen check-env
  trnqwen check-env --json | jq .problems
  trnqwen check-env --device neuron --assets-dir /fsx/assets/hf/Qwen3-4B-Instruct-2507
"""

from __future__ import annotations

from trnqwen.cli._options import AssetsOpt, ConfigFileOpt, DeviceOpt, JsonOpt, ModelOpt, given

HELP = "Check packages, device, tools and disk; exit 1 if something blocks training."
EPILOG = (
    "Examples:\n\n"
    "  trnqwen check-env\n\n"
    "  trnqwen check-env --json | jq .problems\n\n"
    "  trnqwen check-env --device neuron --assets-dir /fsx/assets/hf/Qwen3-4B-Instruct-2507\n\n"
    "Never initializes the Neuron runtime in this process (reads neuron-ls and sysfs).\n"
    "Exit 0: nothing blocks training on the detected device; 1: something does."
)


def check_env(
    device: DeviceOpt = None,
    assets_dir: AssetsOpt = None,
    model: ModelOpt = None,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """Report versions, the device and every problem with its fix."""
    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.env.probe import probe_environment

    resolved = resolve_config(given(device=device, assets_dir=assets_dir, model=model), config_file=config_file)
    for w in resolved.warnings:
        output.warn(w)
    cfg = resolved.config
    report = probe_environment(
        device=cfg.device, assets_dir=cfg.resolved_assets_dir, compile_cache_dir=cfg.compile_cache_dir, model=cfg.model
    )
    if json_out:
        output.print_json(report.as_dict())
    else:
        _render(report)
    return 0 if report.ok else 1


def _gib(n):
    from trnqwen.units import format_bytes

    return None if n is None else format_bytes(n, smallest="GiB", largest="GiB")


def _render(report) -> None:
    from trnqwen import output

    d, n, t = report.device, report.neuron, report.torch
    torch_txt = f"{t['version']} ({t['build']} build)" if t["version"] else "not installed"
    rows = [
        ("python", report.python["version"]),
        ("torch", torch_txt),
        ("device", f"{d['type']} x {d['count']}" + (f" (requested {d['requested']})" if d["requested"] != "auto" else "")),
    ]
    if d["type"] == "neuron" or n["driver_version"] or n["neuron_ls"]:
        rows += [
            ("instance type", n["instance_type"]),
            ("neuron devices", n["devices"]),
            ("logical NeuronCores", f"{n['logical_cores']} (LNC={n['lnc']}, from {n['lnc_source']})"),
            ("HBM per rank", _gib(n["memory_bytes_per_rank"])),
            ("neuron driver", n["driver_version"]),
            ("neuronx-cc", n["compiler_version"]),
            ("cores held by others", ", ".join(str(h["pid"]) for h in n["held_by_other_processes"]) or "none"),
        ]
    elif d["type"] == "cuda":
        rows.append(("GPU memory per rank", _gib(d["memory_bytes_per_rank"])))
    p = report.paths
    rows += [
        ("torchrun", report.tools["torchrun"] or "not on PATH"),
        ("assets dir", f"{p['assets_dir']} ({'present' if p['assets_present'] else 'not fetched'})"),
        ("free disk there", _gib(p["free_bytes_at_assets"])),
        ("compile cache", f"{p['compile_cache_dir']}" + ("" if p["compile_cache_writable"] else " (not writable)")),
        ("HF token set", "yes" if report.hf["token_set"] else "no"),
        ("HF_HUB_OFFLINE", report.hf["hub_offline"] or "unset"),
        ("known-good set", report.combination["closest"] + (" (matches)" if report.combination["ok"] else " (differs)")
         if report.combination["closest"] else "none recorded"),
    ]
    # output.table escapes every cell ("trnqwen[train]" survives); escaping here too showed a backslash.
    output.table("Environment", ["item", "value"], rows)
    output.table("Packages", ["package", "version"], [(k, v or "-") for k, v in report.packages.items()])
    if report.problems:
        _print_problems(report.problems)
    blocking = sum(1 for pr in report.problems if pr.severity == "error")
    if blocking:
        output.console(stderr=False).print(
            f"[red]{blocking} problem(s) block training on {d['type']}[/red] (fixes above)"
        )
    else:
        output.console(stderr=False).print(f"[green]Ready:[/green] nothing blocks training on {d['type']}.")


def _print_problems(problems) -> None:
    """Each problem on its line and its fix whole on the next: a fix is a command or a URL to copy,
    so it is never cut to a table column (rich would end it with an ellipsis)."""
    from rich.text import Text

    from trnqwen import output
    from trnqwen.errors import redact

    colour = {"error": "red", "warning": "yellow", "info": "cyan"}
    console = output.console(stderr=False)
    console.print(Text("Problems", style="italic"))
    for pr in problems:
        line = Text(f"{pr.severity:<8} ", style=colour.get(pr.severity, ""))
        line.append(redact(pr.message))
        console.print(line, soft_wrap=True)
        if pr.fix:
            console.print(Text(f"{'':<9}fix: {redact(pr.fix)}"), soft_wrap=True)
