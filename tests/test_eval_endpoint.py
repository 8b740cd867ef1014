"""``trnqwen eval --tasks --endpoint``: harness tasks scored through an OpenAI-compatible server.

The end-to-end test serves the tiny model with ``trnqwen serve`` on loopback (one start) and runs
the bundled generative task twice, as two real ``trnqwen eval`` commands: in-process (the
harness's ``HFLM``) and through the endpoint (the harness's ``local-chat-completions``).  Both
answer greedily, so every answer and the score must be the same.  Neither prints the harness's
``fatal: not a git repository`` line (its ``git describe`` in a folder that is no checkout).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, TRNQWEN, assert_clean_error, run_subprocess

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
GEN_TASK = "trnqwen_calculator_gen"
LIMIT = 3


# --- the parts around the harness ------------------------------------------------------------------


def test_endpoint_urls_are_read_as_a_server_root():
    from trnqwen.errors import UsageError
    from trnqwen.evaluate.endpoint import root_url

    for given in ("http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1",
                  "http://127.0.0.1:8000/v1/chat/completions", " http://127.0.0.1:8000/v1/completions/ "):
        assert root_url(given) == "http://127.0.0.1:8000", given
    assert root_url("https://proxy.example/llm/v1") == "https://proxy.example/llm"  # a prefix before /v1 is kept
    for bad in ("127.0.0.1:8000", "ftp://host/v1", "http://"):
        with pytest.raises(UsageError, match="not an http"):
            root_url(bad, "--endpoint")


def test_the_served_model_is_picked_by_the_folder_it_serves(tmp_path):
    from trnqwen.errors import EnvironmentProblem, UsageError
    from trnqwen.evaluate.endpoint import choose_model
    from trnqwen.evaluate.targets import EvalTarget

    model = EvalTarget("step-3", tmp_path / "ft" / "hf" / "step-3", tmp_path / "ft" / "hf" / "step-3")
    assert choose_model(["whatever-name"], model, "u") == "whatever-name"  # one served model: that one
    assert choose_model(["Qwen/Qwen3-4B", str(model.folder)], model, "u") == str(model.folder)
    with pytest.raises(UsageError, match="serves 2 models .* none is"):
        choose_model(["a", "b"], model, "u")
    with pytest.raises(EnvironmentProblem, match="lists no model"):
        choose_model([], model, "u")
    base = tmp_path / "base"
    adapter = EvalTarget("step-2", base, base, adapter=tmp_path / "lora" / "hf" / "step-2")
    assert choose_model([str(base), "lora-step-2"], adapter, "u") == "lora-step-2"  # vLLM: base + --lora-modules name
    merged = str(tmp_path / "lora" / "hf" / "step-2.merged")
    assert choose_model([str(base), merged, "other"], adapter, "u") == merged  # transformers: the merged folder


def test_generative_tasks_only(tmp_path):
    from trnqwen.errors import UsageError
    from trnqwen.evaluate.endpoint import require_generative
    from trnqwen.evaluate.harness import output_type, resolve_tasks

    choice, gen = resolve_tasks(["trnqwen_calculator", GEN_TASK])
    assert (output_type(choice), output_type(gen)) == ("multiple_choice", "generate_until")
    base = tmp_path / "base.yaml"
    base.write_text("output_type: generate_until\ndataset_path: json\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text("include: base.yaml\ntask: mine\n")
    (own,) = resolve_tasks([str(mine)])
    assert output_type(own) == "generate_until"  # read through its include
    require_generative([(gen.name, "generate_until"), ("unknown", None)], "--endpoint")
    with pytest.raises(UsageError, match="trnqwen_calculator is multiple_choice.*generative twin: trnqwen_calculator_gen"):
        require_generative([(choice.name, "multiple_choice")], "--endpoint")


def test_endpoint_mistakes_are_one_line(cli, tiny_assets):
    folder = str(tiny_assets)
    r = cli("eval", folder, "--tasks", "trnqwen_calculator", "--endpoint", "http://127.0.0.1:9")
    assert_clean_error(r, code=2, contains="task trnqwen_calculator is multiple_choice")
    r = cli("eval", folder, "--tasks", GEN_TASK, "--base-endpoint", "http://127.0.0.1:9")
    assert_clean_error(r, code=2, contains="--base-endpoint goes with --endpoint")
    r = cli("eval", folder, "--endpoint", "http://127.0.0.1:9")
    assert_clean_error(r, code=2, contains="--endpoint and --base-endpoint score harness tasks")
    r = cli("eval", folder, "--tasks", GEN_TASK, "--endpoint", "http://127.0.0.1:9", "--fail-below", f"{GEN_TASK}=-0.1")
    assert_clean_error(r, code=2, contains="no --base-endpoint scores it")
    r = cli("eval", folder, "--tasks", GEN_TASK, "--endpoint", "http://127.0.0.1:9", "--base")
    assert_clean_error(r, code=2, contains="the base is scored through its own server")
    r = cli("eval", folder, folder, "--tasks", GEN_TASK, "--endpoint", "http://127.0.0.1:9")
    assert_clean_error(r, code=2, contains="--endpoint scores one model")
    r = cli("eval", folder, "--tasks", GEN_TASK, "--endpoint", "localhost:9")
    assert_clean_error(r, code=2, contains="not an http(s) URL")


def test_no_server_at_the_endpoint_is_exit_3(cli, tiny_assets):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("eval", str(tiny_assets), "--tasks", GEN_TASK, "--endpoint", f"http://127.0.0.1:{port}/v1")
    assert_clean_error(r, code=3, contains=f"--endpoint http://127.0.0.1:{port}: no server answers there")
    assert "trnqwen serve" in r.err


# --- lm_eval's stray git line ------------------------------------------------------------------------


def test_the_git_line_is_dropped_and_everything_else_passes(tmp_path):
    """A real ``git describe`` outside a checkout, inside the filter: its line is gone; the lines
    around it (a child's and this process's own) come through in order."""
    script = (
        f"import sys, subprocess; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from trnqwen.evaluate.stderr_filter import without_git_noise\n"
        "with without_git_noise():\n"
        "    sys.stderr.write('before\\n'); sys.stderr.flush()\n"
        "    subprocess.run(['git', 'describe', '--always'], stdout=subprocess.DEVNULL)\n"
        "    subprocess.run([sys.executable, '-c', 'import sys; sys.stderr.write(\"child\\\\n\")'])\n"
        "    sys.stderr.write('progress 1/2\\rprogress 2/2\\n')\n"
        "sys.stderr.write('after\\n')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b"before\nchild\nprogress 1/2\rprogress 2/2\nafter\n", proc.stderr
    bare = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, cwd=tmp_path)
    assert "fatal: not a git repository" in bare.stderr  # what the filter removed is what git prints here


def test_the_filter_holds_a_split_line_until_it_knows():
    from trnqwen.evaluate.stderr_filter import _Filter

    f = _Filter()
    out = f.feed(b"ok\nfatal: not a g") + f.feed(b"it repository (or any): .git\nfatal: other\n") + f.feed(b"fat")
    assert out + f.close() == b"ok\nfatal: other\nfat"


# --- the real thing: in-process and through trnqwen serve agree --------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny model served by ``trnqwen serve`` (transformers) on loopback, for the module."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    model = write_tiny_qwen3(tmp_path_factory.mktemp("endpoint") / "tiny-qwen3")
    port = _free_port()
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([*TRNQWEN, "serve", str(model), "--port", str(port), "--engine", "transformers"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("try: curl"):
                break
        assert proc.poll() is None, proc.stderr.read()
        yield model, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_in_process_and_through_trnqwen_serve_agree(served, tmp_path):
    model, url = served
    common = ["eval", str(model), "--tasks", GEN_TASK, "--limit", str(LIMIT), "--device", "cpu", "--json"]
    local = run_subprocess(*common, "--no-base", cwd=tmp_path, env=OFFLINE, timeout=800)
    assert local.code == 0, local.text[-3000:]
    remote = run_subprocess(*common, "--endpoint", url + "/v1", cwd=tmp_path, env=OFFLINE, timeout=800)
    assert remote.code == 0, remote.text[-3000:]
    (mine,), (theirs,) = json.loads(local.out)["results"], json.loads(remote.out)["results"]
    assert mine["endpoint"] is None and theirs["endpoint"] == url
    answers, served_answers = mine["answers"][GEN_TASK], theirs["answers"][GEN_TASK]
    assert len(answers) == LIMIT and all(a.strip() for a in answers), answers  # real text, one per question
    assert served_answers == answers  # greedy both ways: the same words, question by question
    assert theirs["scores"] == mine["scores"]
    assert mine["scores"][GEN_TASK]["metric"] == "exact_match,stripped" and mine["scores"][GEN_TASK]["samples"] == LIMIT
    for r in (local, remote):  # tmp_path is no git checkout: the harness's git call would say so
        assert "not a git repository" not in r.err, r.err[-2000:]
