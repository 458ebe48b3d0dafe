"""``streamrec serve --processes``: the setting, and a worker's app built from the command's
configuration (the multi-process server itself: tests/integration/serving/test_processes.py).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from streamrec.config import ServingConfig, StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.serving.processes import WORKER_CONFIG_ENV, create_app
from tests.support import trained_snapshots


def test_processes_is_a_setting_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServingConfig().processes == 1
    monkeypatch.setenv("STREAMREC_SERVING__PROCESSES", "2")
    assert StreamrecConfig().serving.processes == 2
    with pytest.raises(ValueError, match="processes"):
        ServingConfig(processes=0)


def test_a_worker_serves_the_commands_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained_snapshots(tmp_path, count=1).promote(1)
    cfg = StreamrecConfig(learner={"snapshot_dir": tmp_path}, serving={"processes": 2})
    monkeypatch.setenv(
        WORKER_CONFIG_ENV, orjson.dumps({"config": cfg.model_dump(mode="json"), "store": False}).decode()
    )
    with TestClient(create_app()) as client:
        response = client.post("/score", json={"user": "u1", "items": ["i1:c1", "i2"]})
    assert response.status_code == 200 and response.json()["version"] == 1


def test_a_worker_started_without_the_command_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKER_CONFIG_ENV, raising=False)
    with pytest.raises(ConfigError, match="streamrec serve"):
        create_app()
