"""``streamrec serve --processes``: the setting, and a worker's app built from the command's
configuration (the multi-process server itself: tests/integration/serving/test_processes.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
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


# In a fresh interpreter: Paddle is not imported yet there, as in a new server process.
_NEW_SERVER_PROCESS = """
import logging.config, os, signal, sys
from streamrec.serving.processes import WORKER_CONFIG_ENV, worker_log_config
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append("SIGTERM"))
os.environ[WORKER_CONFIG_ENV] = '{"supervisor": %d}' % os.getpid()
logging.config.dictConfig(worker_log_config())
assert "paddle" not in sys.modules, "the supervisor loaded engines again"
os.environ[WORKER_CONFIG_ENV] = '{"supervisor": %d}' % os.getppid()
logging.config.dictConfig(worker_log_config())
assert "paddle" in sys.modules, "the engines were not loaded"
assert not signal.pthread_sigmask(signal.SIG_BLOCK, []), "signals left blocked"
os.kill(os.getpid(), signal.SIGTERM)
assert got == ["SIGTERM"], got
print("kept")
"""


def test_a_new_server_process_loads_its_engines_with_its_logging_and_keeps_its_stop_handlers() -> None:
    """Paddle is imported where uvicorn applies the log configuration (first in a server process).

    SIGTERM then still reaches the handler set before, not Paddle's abort.
    """
    done = subprocess.run(
        [sys.executable, "-c", _NEW_SERVER_PROCESS], capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != WORKER_CONFIG_ENV},
    )
    assert done.returncode == 0 and done.stdout.strip() == "kept", done.stderr[-3000:]
