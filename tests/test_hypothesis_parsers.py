"""No input crashes a parser: arbitrary bytes and values through the config file reader, the
config resolver (file, environment, flags), the run-record reader, size parsing, Hub file-name
checking and the launcher's root-cause reader fail only with trnqwen's own errors.

(The log parser's own hypothesis tests live in tests/test_inspect_logs.py.)
"""

from __future__ import annotations

import string
from pathlib import PurePosixPath

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trnqwen.config import FIELD_NAMES, ResolvedConfig, load_config_file, resolve_config
from trnqwen.errors import CheckFailed, ConfigError, TrnqwenError, UsageError

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

toml_scalars = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.text(max_size=30), st.lists(st.integers(-5, 5), max_size=3),
)
field_names = st.one_of(st.sampled_from(FIELD_NAMES), st.text(string.ascii_lowercase + "_-", min_size=1, max_size=20))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').encode("unicode_escape").decode("ascii").replace("\\\\", "\\") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


@SETTINGS
@given(data=st.binary(max_size=400))
def test_config_file_reader_any_bytes(tmp_path, data):
    path = tmp_path / "trnqwen.toml"
    path.write_bytes(data)
    try:
        values = load_config_file(path)
    except ConfigError as exc:
        assert exc.problems and all("\n" not in p for p in exc.problems)
        return
    assert isinstance(values, dict) and set(values) <= set(FIELD_NAMES)


@SETTINGS
@given(table=st.dictionaries(field_names, toml_scalars, max_size=6), nested=st.booleans())
def test_resolver_any_toml_table(tmp_path, table, nested):
    lines = ["[run]"] if nested else []
    lines += [f'"{k}" = {_toml_value(v)}' for k, v in table.items()]
    path = tmp_path / "trnqwen.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        resolved = resolve_config({}, config_file=path, environ={})
    except ConfigError as exc:
        assert exc.problems and exc.exit_code == 2
        return
    assert isinstance(resolved, ResolvedConfig)
    assert all(v == f"file {path}" for v in resolved.sources.values())


@SETTINGS
@given(env=st.dictionaries(st.sampled_from(FIELD_NAMES).map(lambda f: "TRNQWEN_" + f.upper()),
                           st.text(max_size=20).filter(lambda s: "\0" not in s), max_size=5))
def test_resolver_any_environment_values(env):
    try:
        resolved = resolve_config({}, environ=env, cwd=None, config_file=None)
    except ConfigError as exc:
        assert all(line for line in exc.problems)
        return
    for key in resolved.sources:
        assert resolved.sources[key].startswith("env TRNQWEN_")


@SETTINGS
@given(flags=st.dictionaries(st.sampled_from(FIELD_NAMES), toml_scalars, max_size=4))
def test_resolver_any_flag_values(flags):
    try:
        resolve_config(flags, environ={})
    except ConfigError:
        pass


@SETTINGS
@given(data=st.binary(max_size=300))
def test_run_record_reader_any_bytes(tmp_path, data):
    from trnqwen.logs.sources import resolve_input

    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "run.json").write_bytes(data)
    (run / "train.log").write_text("x\n")
    try:
        inp = resolve_input(str(run))
    except UsageError:
        return
    assert inp.path is not None


@SETTINGS
@given(text=st.text(max_size=20))
def test_parse_size_any_text(text):
    from trnqwen.units import parse_size

    try:
        n = parse_size(text)
    except UsageError:
        return
    assert isinstance(n, int) and n >= 0


@SETTINGS
@given(name=st.text(max_size=40))
def test_hub_names_accepted_stay_inside(name):
    from trnqwen.fetch.plan import check_repo_path

    try:
        ok = check_repo_path(name)
    except CheckFailed:
        return
    parts = PurePosixPath(ok).parts
    assert ".." not in parts and not PurePosixPath(ok).is_absolute() and "\\" not in ok


@SETTINGS
@given(lines=st.lists(st.one_of(
    st.text(max_size=60),
    st.sampled_from(["Traceback (most recent call last):", "  File \"x.py\", line 1", "[rank1]: ValueError: x",
                     "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0])",
                     "Traceback (most recent call last): (RANK 0)", "OSError: [Errno 28] No space left on device",
                     "Root Cause (first observed failure):", "  rank      : 1 (local_rank: 1)"]),
), max_size=30))
@example(lines=["Traceback (most recent call last):", "0\n0"])  # an item holding two lines (was flaky)
def test_root_cause_any_lines(lines):
    from trnqwen.train.rootcause import root_cause

    cause = root_cause(lines)
    assert cause is None or (isinstance(cause, str) and "\n" not in cause and cause.strip())


@pytest.mark.parametrize("text", ["", "[run]\n[run]\n", "run = 3\n", "[run]\nrun = {}\n", "steps = {a = 1}\n"])
def test_odd_but_valid_toml_shapes(tmp_path, text):
    path = tmp_path / "trnqwen.toml"
    path.write_text(text)
    try:
        resolve_config({}, config_file=path, environ={})
    except TrnqwenError as exc:
        assert exc.exit_code == 2
