"""A flag whose help says ``null: never`` (or ``null: keep nothing``) takes ``null``.

Found by the settings tour: ``--stop-when-idle`` says "(null: never)", yet ``--stop-when-idle
null`` was refused ("'null' is not a valid float"), so an operator could not turn off for one
run an idle stop set in the environment or the settings file; ``--data-dir`` likewise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from streamrec.cli.common import build_config
from streamrec.cli.options import FLAGS, setting


def _app(seen: list[object]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def run(
        stop_when_idle: float | None = setting("consumer.stop_when_idle_s"),
        data_dir: Path | None = setting("services.data_dir"),
    ) -> None:
        cfg = build_config(
            consumer={"stop_when_idle_s": stop_when_idle}, services={"data_dir": data_dir}
        )
        seen.append((cfg.consumer.stop_when_idle_s, cfg.services.data_dir))

    return app


def test_null_turns_off_what_the_environment_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no streamrec.toml
    monkeypatch.setenv("STREAMREC_CONSUMER__STOP_WHEN_IDLE_S", "5")
    monkeypatch.setenv("STREAMREC_SERVICES__DATA_DIR", str(tmp_path))
    seen: list[object] = []
    app = _app(seen)
    out = CliRunner().invoke(app, ["--stop-when-idle", "null", "--data-dir", "null"])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, ["--stop-when-idle", "7"])
    assert out.exit_code == 0, out.output
    assert seen == [(None, None), (7.0, tmp_path)]


def test_every_flag_that_says_null_takes_it() -> None:
    said = [flag.name for flag in FLAGS.values() if "null" in flag.help]
    assert said and all(FLAGS[path].default == "null" for path, f in FLAGS.items() if f.name in said)
