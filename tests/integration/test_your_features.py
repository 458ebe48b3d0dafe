"""docs/your-features.md, run as written: its streamrec.toml, its commands as separate
processes on the session's broker and Redis, a small stream with its events' fields, and its
`curl` against `streamrec serve`.
"""

from __future__ import annotations

import json
import random
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from streamrec.config import KafkaConfig, RedisStoreConfig
from streamrec.local.ports import free_port
from tests.integration.test_cli_flow import services_env
from tests.support import small_tables

PAGE = Path(__file__).parents[2] / "docs" / "your-features.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def _events(path: Path, n: int = 600) -> None:
    """``n`` events shaped as the page's examples: its two lines first, then more of the same fields."""
    lines = [json.loads(line) for line in _blocks("json")[0].splitlines()]
    rng = random.Random(7)
    genres = ["drama", "crime", "comedy", "horror", "news"]
    for k in range(n):
        user, item = rng.randrange(20), rng.randrange(40)
        lines.append({
            **lines[0], "event_id": f"g-{k}", "user_id": f"u{user}", "item_id": f"i{item}",
            "category_id": f"c{item % 5}", "ts": lines[-1]["ts"] + 1000,
            "genres": [genres[item % 5], genres[(item // 5) % 5]], "dwell_s": rng.randrange(600),
            "tier": ["free", "gold"][user % 2], "device": rng.choice(["ios", "web"]),
        })
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))


def _run(command: str, env: dict[str, str], cwd: Path) -> str:
    args = shlex.split(command)
    proc = subprocess.run(
        [sys.executable, "-m", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180,
        check=False,
    )
    assert proc.returncode == 0, f"{command} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("learner", ["din", "deepfm"])
def test_the_walk_through_runs_as_written(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path, learner: str,
) -> None:
    """Either built-in model reads the page's features, is exported with them and serves them."""
    (tmp_path / "streamrec.toml").write_text(_blocks("toml")[0])
    _events(tmp_path / "events.jsonl")
    port = free_port()
    env = {
        **services_env(kafka_config, store_config, unique_name),
        "STREAMREC_LEARNER__GROUP_ID": f"l-{unique_name}",
        "STREAMREC_MODEL__TABLES": json.dumps(small_tables()),  # small tables: a quick test
        "STREAMREC_MODEL__LEARNER": learner,
        "STREAMREC_SERVING__PORT": str(port),
        "STREAMREC_SERVING__POLL_S": "60",
    }
    commands = [line for block in _blocks("bash") for line in block.splitlines() if line.strip()]
    outputs = {}
    for command in commands:
        if command.startswith("curl "):
            outputs[command] = _curl(command, env, tmp_path, port)
        else:
            assert command.startswith("streamrec "), command
            outputs[command] = _run(command, env, tmp_path)
    consumed = next(v for k, v in outputs.items() if k.startswith("streamrec consumers"))
    assert "consumed 602 events" in consumed
    contract = json.loads(next((tmp_path / "snapshots" / "exports").glob("v*/contract.json")).read_text())
    declared = [f["name"] for f in contract["features"] if not f["builtin"]]  # after item, category, user
    assert declared == ["genres", "dwell_s", "tier", "device"]
    assert contract["model"]["learner"] == learner
    scored, given = [v for k, v in outputs.items() if k.startswith("streamrec score")]
    assert re.search(r"user u1 with [1-9]\d* behaviours", scored), scored
    assert "i7" in scored and "i9" in scored
    assert "user u1 with 2 behaviours" in given and "i7" in given, given  # the request's own history
    doc = json.loads(next(v for k, v in outputs.items() if k.startswith("curl ")))
    assert len(doc["scores"]) == 1 and 0.0 < doc["scores"][0] < 1.0


def _curl(command: str, env: dict[str, str], cwd: Path, port: int) -> str:
    """The page's ``curl`` against ``streamrec serve``, started for it and stopped after."""
    args = shlex.split(command)
    url = args[args.index("-s") + 1].replace("localhost:8000", f"127.0.0.1:{port}")
    body = args[args.index("-d") + 1].encode()
    server = subprocess.Popen(
        [sys.executable, "-m", "streamrec", "serve"], env=env, cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "streamrec serve did not start"
                time.sleep(0.3)
        request = urllib.request.Request(f"http://{url}", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(response.read().decode())
    finally:
        server.terminate()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()


def test_features_declared_to_the_consumers_or_the_learner_alone_are_named(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
) -> None:
    """Found from outside: each process reads its own settings, and a feature declared to one and
    not the other was lost without a word (the learner trained on, every sample at its default,
    or never trained on what the consumers sent).
    """
    page = _blocks("toml")[0]
    consumers, learner = tmp_path / "consumers", tmp_path / "learner"
    consumers.mkdir()
    learner.mkdir()
    # the consumers declare the page's features; the learner all but dwell_s, and one more
    (consumers / "streamrec.toml").write_text(page)
    specs = page.split("[[features]]")
    kept = [s for s in specs[1:] if 'name = "dwell_s"' not in s]
    assert len(kept) == len(specs) - 2
    (learner / "streamrec.toml").write_text(
        "".join(f"[[features]]{s}" for s in kept) + '\n[[features]]\nname = "shelf"\nrole = "context"\n'
    )
    _events(consumers / "events.jsonl", n=1_200)
    env = {
        **services_env(kafka_config, store_config, unique_name),
        "STREAMREC_LEARNER__GROUP_ID": f"l-{unique_name}",
        "STREAMREC_MODEL__TABLES": json.dumps(small_tables()),
        "STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
        "STREAMREC_LEARNER__METRICS_PORT": "0",
    }
    _run("streamrec produce events.jsonl", env, consumers)
    _run("streamrec consumers run --stop-when-idle 3", env, consumers)
    proc = subprocess.run(
        [sys.executable, "-m", "streamrec", "learner", "run", "--interval", "5", "--stop-when-idle", "3"],
        env=env, cwd=learner, capture_output=True, text=True, timeout=180, check=True,
    )
    drift = [line for line in proc.stderr.splitlines() if "streamrec.learner.drift" in line]
    assert len(drift) == 2, proc.stderr
    assert "'dwell_s'" in drift[0] and "not trained on" in drift[0]
    assert "'shelf'" in drift[1] and "reads its default" in drift[1]
