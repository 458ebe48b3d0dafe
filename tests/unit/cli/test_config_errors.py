"""A malformed setting is one line naming the setting (or file) and where it is wrong, at once.

Measured before: malformed JSON in an env var was a 79-line traceback naming neither the
variable nor the position, a malformed ``streamrec.toml`` 71 lines without the file's name, a
Redis URL with an unknown scheme 60 lines. These run the real entry point and reach no
service: each fails while reading its configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The process starts Python, Typer and the config: a few seconds on a busy 2-core machine.
_BOUND_S = 20.0


def streamrec_fails(args: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    """Run ``streamrec`` with only ``env`` over a clean environment; its stderr lines, after
    checking it failed with status 1 within the bound.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMREC_")}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "streamrec", *args], env={**clean, **env}, cwd=cwd,
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert time.monotonic() - started < _BOUND_S
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr.splitlines()


@pytest.mark.parametrize("args", [["consumers", "run"], ["learner", "run"], ["serve"]], ids=str)
def test_malformed_json_in_an_env_var_names_the_variable_and_the_position(
    args: list[str], tmp_path: Path
) -> None:
    lines = streamrec_fails(args, {"STREAMREC_KAFKA__CLIENT": "{bad json"}, tmp_path)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: STREAMREC_KAFKA__CLIENT is not valid JSON")
    assert "line 1 column 2" in lines[0]


def test_a_malformed_toml_file_names_the_file_and_the_position(tmp_path: Path) -> None:
    (tmp_path / "streamrec.toml").write_text('log_level = "INFO"\n[kafka\nx = 1\n')
    lines = streamrec_fails(["consumers", "run"], {}, tmp_path)
    assert len(lines) == 1, lines
    assert str(tmp_path / "streamrec.toml") in lines[0] and "line 2, column 7" in lines[0]


def test_a_redis_url_with_an_unknown_scheme_names_the_option(tmp_path: Path) -> None:
    lines = streamrec_fails(["consumers", "run", "--redis-url", "foo://x"], {}, tmp_path)
    assert len(lines) == 1, lines
    assert "STREAMREC_STORE__URL" in lines[0] and "--redis-url" in lines[0]
    assert "redis://" in lines[0] and "foo://x" in lines[0]


def test_a_mistyped_setting_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    lines = streamrec_fails(["consumers", "run"], {"STREAMREC_CONSUMER__BATCH_SIZE": "many"}, tmp_path)
    assert len(lines) == 1, lines
    assert "STREAMREC_CONSUMER__BATCH_SIZE" in lines[0] and "'many'" in lines[0]


def test_a_mistyped_value_in_a_mapping_names_the_variable_that_sets_it(tmp_path: Path) -> None:
    # Found by a tour of docs/operating/deployment.md: a number in STREAMREC_KAFKA__TOPIC_CONFIG
    # was reported as STREAMREC_KAFKA__TOPIC_CONFIG__MIN.INSYNC.REPLICAS, a variable that names no
    # setting (the mapping is set whole, as JSON).
    env = {"STREAMREC_KAFKA__TOPIC_CONFIG": '{"min.insync.replicas": 2}'}
    lines = streamrec_fails(["consumers", "run"], env, tmp_path)
    assert len(lines) == 1, lines
    assert "invalid setting STREAMREC_KAFKA__TOPIC_CONFIG (key 'min.insync.replicas')" in lines[0], lines


@pytest.mark.parametrize("args", [["learner", "run"], ["demo"]], ids=str)
def test_a_learner_class_path_that_does_not_import_is_one_line_before_any_service(
    args: list[str], tmp_path: Path
) -> None:
    lines = streamrec_fails(args, {"STREAMREC_MODEL__LEARNER": "no_such_pkg_xyz:Mine"}, tmp_path)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: STREAMREC_MODEL__LEARNER='no_such_pkg_xyz:Mine': cannot import")


@pytest.mark.parametrize(
    ("env", "args", "named"),
    [
        ({"STREAMREC_LOG_LEVEL": "verbose"}, ["consumers", "run"], "STREAMREC_LOG_LEVEL"),
        ({}, ["consumers", "run", "--log-level", "foo"], "STREAMREC_LOG_LEVEL"),
        ({"STREAMREC_MODEL__DEVICE": "tpu"}, ["learner", "run"], "STREAMREC_MODEL__DEVICE"),
        ({}, ["learner", "run", "--device", "gpu:x"], "STREAMREC_MODEL__DEVICE"),
    ],
    ids=str,
)
def test_a_log_level_or_device_that_names_none_is_one_line(
    env: dict[str, str], args: list[str], named: str, tmp_path: Path
) -> None:
    """Found by a tour: each was a traceback from the logging module or Paddle, the device's
    only once a backtest had built its samples.
    """
    lines = streamrec_fails(args, env, tmp_path)
    assert len(lines) == 1, lines
    assert named in lines[0]


@pytest.mark.parametrize(
    ("env", "args", "named"),
    [
        ({"STREAMREC_LEARNER__INTERVAL_S": "inf"}, ["learner", "run"], "STREAMREC_LEARNER__INTERVAL_S"),
        ({}, ["learner", "run", "--stop-when-idle", "-1"], "STREAMREC_LEARNER__STOP_WHEN_IDLE_S"),
        ({}, ["consumers", "run", "--stop-when-idle", "nan"], "STREAMREC_CONSUMER__STOP_WHEN_IDLE_S"),
        ({"STREAMREC_SERVING__POLL_S": "inf"}, ["serve"], "STREAMREC_SERVING__POLL_S"),
    ],
    ids=str,
)
def test_a_number_setting_not_finite_or_below_its_range_is_one_line(
    env: dict[str, str], args: list[str], named: str, tmp_path: Path
) -> None:
    """Found by a tour: an infinite interval or poll was taken (a learner that never trains),
    and --stop-when-idle took -1 and nan (no bound at all).
    """
    lines = streamrec_fails(args, env, tmp_path)
    assert len(lines) == 1, lines
    assert named in lines[0]


def test_a_gpu_asked_of_a_paddle_without_cuda_is_one_line_before_any_service(tmp_path: Path) -> None:
    lines = streamrec_fails(["learner", "run", "--device", "gpu"], {}, tmp_path)
    assert len(lines) == 1, lines
    assert "STREAMREC_MODEL__DEVICE=gpu" in lines[0] and "CUDA" in lines[0]


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[[features]]\nname = "user"\nrole = "user"\n', "'user'"),  # the user id's table feature
        ('[[features]]\nname = "item"\n', "'item'"),
        ('[[features]]\nname = "shop"\nfield = "item_id"\n', "'item_id'"),
    ],
    ids=["user", "item", "item_id"],
)
def test_a_feature_that_takes_a_built_in_name_or_field_names_it_and_the_setting(
    toml: str, named: str, tmp_path: Path
) -> None:
    """Found by a tour: a feature named ``user`` became a second model input of the user id's
    key, and the others said ``invalid setting STREAMREC_`` without naming the feature.
    """
    (tmp_path / "streamrec.toml").write_text(toml)
    lines = streamrec_fails(["consumers", "run"], {}, tmp_path)
    assert len(lines) == 1, lines
    assert "STREAMREC_FEATURES" in lines[0] and named in lines[0]


@pytest.mark.parametrize("name", ["STREAMREC_CONSUMR__NEGATIVES", "STREAMREC_NEGATIVES",
                                  "STREAMREC_CONSUMER__NEGATIVS", "STREAMREC_FEATURES__NAME",
                                  "STREAMREC_MODEL__TABLES__ROWS", "STREAMREC_KAFKA__CLIENT__ACKS"])
def test_a_variable_of_the_prefix_that_names_no_setting_is_one_line(name: str, tmp_path: Path) -> None:
    """Found by a tour: the first two were ignored without a word (the run took its default),
    while the same typo in streamrec.toml is refused. A name under a list of models was taken
    for a setting: STREAMREC_FEATURES__NAME=x got "invalid setting STREAMREC_FEATURES ... Input
    should be a valid tuple", naming another variable than the one set.
    """
    lines = streamrec_fails(["consumers", "run"], {name: "3"}, tmp_path)
    assert len(lines) == 1, lines
    assert name in lines[0] and "names no setting" in lines[0]
    above = name.rsplit("__", 1)[0]
    if above in ("STREAMREC_FEATURES", "STREAMREC_MODEL__TABLES", "STREAMREC_KAFKA__CLIENT"):
        assert f"{above} is one setting: give its whole value, as JSON" in lines[0]


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_workers_below_one_is_one_line_before_any_service(workers: str, tmp_path: Path) -> None:
    """Found by a tour: ``learner run --workers 0`` was the option's usage box (exit 2), unlike
    every other setting out of range (``--snapshot-every 0``, ``replay backtest --jobs 0``).
    """
    lines = streamrec_fails(["learner", "run", "--workers", workers], {}, tmp_path)
    assert lines == [f"error: --workers must be at least 1, not {workers}"], lines


def test_a_bad_value_in_the_settings_file_names_the_file_and_its_key(tmp_path: Path) -> None:
    (tmp_path / "prod.toml").write_text('[learner]\ninterval_s = "abc"\n')
    lines = streamrec_fails(["learner", "run", "--config", "prod.toml"], {}, tmp_path)
    assert len(lines) == 1, lines
    assert "STREAMREC_LEARNER__INTERVAL_S" in lines[0] and "'abc'" in lines[0]
    assert f"{tmp_path / 'prod.toml'} [learner] interval_s" in lines[0]


def test_a_bad_value_in_the_environment_names_the_variable_not_the_file(tmp_path: Path) -> None:
    (tmp_path / "streamrec.toml").write_text("[learner]\ninterval_s = 30\n")
    lines = streamrec_fails(["learner", "run"], {"STREAMREC_LEARNER__INTERVAL_S": "-1"}, tmp_path)
    assert len(lines) == 1, lines
    assert "STREAMREC_LEARNER__INTERVAL_S (from the environment or its flag)" in lines[0]
    assert "streamrec.toml" not in lines[0]
