"""``trnqwen serve``: vLLM's command and LoRA rules (dry run, on a fake trn2.48xlarge), and a real
``transformers serve`` of a tiny export on loopback answering as trnqwen's own greedy generation."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, TRNQWEN, assert_clean_error, run_subprocess

QWEN3 = ["Qwen3ForCausalLM"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    from tests.ckpt_fixtures import char_tokenizer, make_case
    from tests.lora_fixtures import make_adapter, make_base
    from trnqwen.ckpt.model_folder import CardInfo, complete_export
    from trnqwen.dataset.template import BUILTIN, export_template

    root = tmp_path_factory.mktemp("serve")
    ckpt, assets, _ = make_case(root / "model", tied=False, architectures=QWEN3, seed=2)  # untied: greedy says more than its last input character
    char_tokenizer(assets)
    export_template(assets, BUILTIN["chatml"])
    model = ckpt / "step-3"
    complete_export(model, assets, CardInfo(base_model="Qwen/Qwen3-0.6B", backend="native", steps=3))
    wide, wide_assets, _ = make_case(root / "wide", architectures=QWEN3, num_attention_heads=64, num_key_value_heads=8, head_dim=4)
    complete_export(wide / "step-3", wide_assets, CardInfo(base_model="Qwen/Qwen3-32B", backend="native", steps=3))
    base = make_base(root / "base", tokenizer=True, architectures=QWEN3)
    out = {"model": model, "wide": wide / "step-3", "base": base}
    for name, rank in (("adapter", 8), ("rank4", 4)):
        out[name] = make_adapter(root / name / "hf" / "step-2", base, rank=rank)
    for name, edit in (("saves", {"modules_to_save": ["lm_head"]}), ("dora", {"use_dora": True}),
                       ("embed", {"target_modules": ["q_proj", "embed_tokens"]})):
        folder = make_adapter(root / name / "hf" / "step-2", base, rank=8)
        cfg = json.loads((folder / "adapter_config.json").read_text())
        cfg.update(edit)
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        out[name] = folder
    return out


@pytest.fixture
def trn2(tmp_path) -> dict[str, str]:
    from tests.doubles.neuron import neuron_host

    env = neuron_host(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env["PYTHONPATH"]])  # this checkout first, then the fake torch_neuronx
    return env


def _dry(*args: str, env: dict | None = None) -> dict:
    r = run_subprocess("serve", *args, "--dry-run", "--json", env=env, timeout=120)
    assert r.code == 0, r.text
    return json.loads(r.out)


def test_vllm_on_trainium_by_default_whole_model(exports, trn2):
    doc = _dry(str(exports["wide"]), "--port", "8123", env=trn2)
    argv = doc["command"]
    assert doc["engine"] == "vllm" and argv[1:3] == ["serve", str(exports["wide"])]
    flag = dict(zip(argv, argv[1:]))
    assert flag["--tensor-parallel-size"] == "64"  # trn2.48xlarge at LNC=2: 64 logical cores, 64 heads
    assert flag["--max-model-len"] == "128" and flag["--port"] == "8123"
    assert "--enable-lora" not in argv
    assert doc["env"]["VLLM_CACHE_ROOT"].endswith("neff-cache/vllm")


def test_vllm_tensor_parallel_divides_heads(exports, trn2):
    doc = _dry(str(exports["model"]), env=trn2)
    assert doc["tensor_parallel"] == 4  # 4 attention heads: vLLM refuses 64
    assert any("capped to divide 4 attention heads" in n for n in doc["notes"])


def test_vllm_adapter_command(exports, trn2):
    doc = _dry(str(exports["adapter"]), "--base", str(exports["base"]), env=trn2)
    argv = doc["command"]
    flag = dict(zip(argv, argv[1:]))
    assert argv[2] == str(exports["base"])  # the base is the model, the adapter a LoRA module on it
    assert "--enable-lora" in argv and flag["--max-lora-rank"] == "8"
    name, path = flag["--lora-modules"].split("=", 1)
    assert path == str(exports["adapter"]) and name == doc["model"] == "adapter-step-2"


@pytest.mark.parametrize("case,rule", [
    ("rank4", "LoRA rank 4 is not one vLLM accepts"),
    ("saves", "modules_to_save is set"),
    ("dora", "use_dora is set"),
    ("embed", "target module embed_tokens is not one vLLM's LoRA supports"),
])
def test_vllm_refuses_adapter_before_anything_starts(exports, case, rule, tmp_path):
    r = run_subprocess("serve", str(exports[case]), "--base", str(exports["base"]), "--engine", "vllm", "--dry-run",
                       timeout=120)
    assert_clean_error(r, code=1, contains=rule)
    assert len([line for line in r.err.splitlines() if line.startswith("Error:")]) == 1


def test_vllm_rules_unit(exports):
    from trnqwen.contract.peft_adapter import read_adapter_config
    from trnqwen.serve.plan import tensor_parallel, vllm_lora_problems

    assert vllm_lora_problems(exports["adapter"], read_adapter_config(exports["adapter"])) == []
    assert "320" in vllm_lora_problems(exports["rank4"], {"r": 4})[0]
    assert vllm_lora_problems(exports["adapter"], {"r": 8, "rank_pattern": {"q_proj": 12}})[0].startswith("LoRA rank 12")
    assert (tensor_parallel(64, 64), tensor_parallel(64, 40), tensor_parallel(64, None), tensor_parallel(1, 16)) == (64, 40, 64, 1)


def test_vllm_refusal_comes_before_the_install_check(exports):
    """Without --dry-run and without vLLM: the adapter's broken rule (exit 1), not the missing engine (3)."""
    r = run_subprocess("serve", str(exports["rank4"]), "--base", str(exports["base"]), "--engine", "vllm", timeout=120)
    assert_clean_error(r, code=1, contains="LoRA rank 4 is not one vLLM accepts")


def test_vllm_not_installed_exit_3(exports, trn2):
    import shutil

    if shutil.which("vllm") or (Path(os.sys.executable).parent / "vllm").exists():
        pytest.skip("vllm is installed here")
    r = run_subprocess("serve", str(exports["model"]), env=trn2, timeout=120)
    assert_clean_error(r, code=3, contains="vllm is not installed")
    assert "--engine transformers" in r.err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_with(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and "transformers" in cmdline and "serve" in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_transformers_serve_answers_as_greedy_generation_and_stops_on_ctrl_c(exports):
    """A real `transformers serve` on loopback: /v1/chat/completions at temperature 0 gives the
    answer trnqwen's own greedy generation gives on the same rendered prompt; SIGINT -> 130, no child."""
    from transformers import AutoTokenizer

    from trnqwen.ckpt.generate import generate
    from trnqwen.ckpt.layout import find_config, resolve_checkpoint

    model = exports["model"]
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    proc = subprocess.Popen([*TRNQWEN, "serve", str(model), "--port", str(port), "--engine", "transformers"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("try: curl"):
                break
        ready_s = time.monotonic() - started
        assert any(f"at http://127.0.0.1:{port}/v1" in line for line in lines), (lines, proc.stderr.read() if proc.poll() is not None else "")
        messages = [{"role": "user", "content": "What is 2 plus 3?"}]
        body = json.dumps({"model": str(model), "messages": messages, "max_tokens": 12, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())["choices"][0]["message"]["content"]
        served = _processes_with(str(model))
        assert served, "the transformers serve child is not running"

        tokenizer = AutoTokenizer.from_pretrained(str(model))
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ckpt = resolve_checkpoint(model)
        greedy = generate(ckpt, find_config(ckpt), prompt, max_new_tokens=12, device="cpu")
        assert greedy["error"] is None and greedy["completion"].strip()
        assert answer == greedy["completion"], (answer, greedy)
        # eval --generate's own path: the run's prompt ids, left-padded, cut at end-of-turn, decoded and stripped
        from trnqwen.evaluate import model as em
        from trnqwen.evaluate.data import Conversation
        from trnqwen.evaluate.targets import resolve_target

        loaded = em.load_model(resolve_target(str(model), Path("runs")), "cpu")
        ids = tokenizer(prompt)["input_ids"]
        [eval_ids] = em.answer(loaded, [Conversation(prompt_ids=ids, reference_ids=[])], pad_id=tokenizer.eos_token_id,
                               eos_ids=em.eos_ids_of(loaded, tokenizer), prompt_len=em.prompt_length(
                                   [Conversation(prompt_ids=ids, reference_ids=[])]),
                               max_new_tokens=12, batch_size=1, device_type="cpu")
        assert answer == tokenizer.decode(eval_ids, skip_special_tokens=True).strip()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert not _processes_with(str(model))
        print(f"ready in {ready_s:.1f}s; answer {answer!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _plan(argv: list[str], port: int):
    from trnqwen.serve.plan import ServePlan

    return ServePlan(engine="transformers", argv=argv, env={}, host="127.0.0.1", port=port, model="m",
                     served=Path("."), kind="model")


def test_server_that_dies_before_answering_is_one_error_with_its_last_lines():
    import sys

    from trnqwen.serve.process import ServerDied, run_server

    code = "import sys; print('loading the model'); print('RuntimeError: no weights here', flush=True); sys.exit(4)"
    with pytest.raises(ServerDied) as info:
        run_server(_plan([sys.executable, "-c", code], _free_port()), ready_timeout=60, handle_signals=False)
    assert "exited with code 4 before it answered" in info.value.message
    assert info.value.problems[-1] == "transformers| RuntimeError: no weights here"


def test_server_that_never_answers_is_stopped_at_the_ready_timeout():
    import sys

    from trnqwen.serve.process import ServerDied, run_server

    started = time.monotonic()
    with pytest.raises(ServerDied, match="did not answer on http://127.0.0.1:.* within 2s"):
        run_server(_plan([sys.executable, "-c", "import time; print('still loading', flush=True); time.sleep(60)"],
                         _free_port()), ready_timeout=2, grace_s=5, handle_signals=False)
    assert time.monotonic() - started < 20  # stopped, not waited for


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_transformers_serves_an_adapter_merged(exports, tmp_path):
    """An adapter on transformers is served merged into its base (<adapter>.merged, written once),
    and answers as greedy generation on that merged model does."""
    from tests.lora_fixtures import make_adapter
    from trnqwen.ckpt.generate import generate
    from trnqwen.ckpt.layout import find_config, resolve_checkpoint

    adapter = make_adapter(tmp_path / "lora" / "hf" / "step-2", exports["model"], rank=8, seed=1)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([*TRNQWEN, "serve", str(adapter), "--base", str(exports["model"]), "--port", str(port),
                             "--engine", "transformers"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    merged = adapter.with_name("step-2.merged")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("try: curl"):
                break
        assert proc.poll() is None, proc.stderr.read()
        messages = [{"role": "user", "content": "What is 2 plus 3?"}]
        body = json.dumps({"model": str(merged), "messages": messages, "max_tokens": 12, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())["choices"][0]["message"]["content"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        err = proc.stderr.read()
        assert f"-> {merged}" in err and "served merged" in err
        assert (merged / "config.json").is_file()
        prompt = "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"
        ckpt = resolve_checkpoint(merged)
        greedy = generate(ckpt, find_config(ckpt), prompt, max_new_tokens=12, device="cpu")
        assert answer == greedy["completion"] and answer.strip(), (answer, greedy)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_vllm_max_model_len_is_the_runs_seq_len(exports, trn2, tmp_path):
    """Served by run id: --max-model-len is what the run trained on, not the model's 128 positions."""
    from trnqwen.rundir import RunRecord

    runs = tmp_path / ".trnqwen" / "runs"
    (runs / "r1").mkdir(parents=True)
    RunRecord(run_id="r1", run_dir=str(runs / "r1"), status="succeeded", config={"seq_len": 64},
              checkpoint_dir=str(exports["wide"].parent), assets_dir=str(exports["wide"].parent.parent / "assets"),
              extra={"exported": str(exports["wide"])}).save()
    r = run_subprocess("serve", "r1", "--dry-run", "--json", env=trn2, cwd=tmp_path, timeout=120)
    assert r.code == 0, r.text
    doc = json.loads(r.out)
    flag = dict(zip(doc["command"], doc["command"][1:]))
    assert flag["--max-model-len"] == "64" and doc["command"][2] == str(exports["wide"])
    assert "max model len 64: the run's seq_len (r1)" in doc["notes"]


def test_transformers_refuses_a_config_without_architectures_and_warns_of_no_chat_template(tmp_path):
    from tests.ckpt_fixtures import make_case
    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    ckpt, assets, _ = make_case(tmp_path / "bare", tokenizer=True)  # Qwen3Config() as is: no architectures
    complete_export(ckpt / "step-3", assets, CardInfo(base_model="Qwen/Qwen3-0.6B", backend="native", steps=3))
    r = run_subprocess("serve", str(ckpt / "step-3"), "--engine", "transformers", "--dry-run", timeout=120)
    assert_clean_error(r, code=2, contains="names no architectures")

    config = json.loads((ckpt / "step-3" / "config.json").read_text())
    (ckpt / "step-3" / "config.json").write_text(json.dumps({**config, "architectures": QWEN3}))
    r = run_subprocess("serve", str(ckpt / "step-3"), "--engine", "transformers", "--dry-run", timeout=120)
    assert r.code == 0 and "has no chat template, so /v1/chat/completions fails" in r.err, r.text


def test_a_killed_trnqwen_takes_its_server_with_it(tmp_path):
    """SIGKILL cannot be forwarded: the child is asked to die with its parent (PR_SET_PDEATHSIG)."""
    import sys

    marker = tmp_path / "child.pid"
    code = (f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); "
            "print('loading', flush=True); time.sleep(120)")
    script = (f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
              "from pathlib import Path\nfrom trnqwen.serve.plan import ServePlan\nfrom trnqwen.serve.process import run_server\n"
              f"run_server(ServePlan(engine='transformers', argv=[sys.executable, '-c', {code!r}], env={{}}, host='127.0.0.1', "
              f"port={_free_port()}, model='m', served=Path('.'), kind='model'), ready_timeout=120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not marker.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(marker.read_text())
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            status = Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}/status").exists() else ""
            if "zombie" in status:
                break
            time.sleep(0.1)
        status = Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}/status").exists() else ""
        assert not status or "zombie" in status, status[:200]
    finally:
        if parent.poll() is None:
            parent.kill()
        if marker.is_file() and Path(f"/proc/{marker.read_text()}").exists():
            os.kill(int(marker.read_text()), signal.SIGKILL)  # the test failed: leave no sleeper behind
