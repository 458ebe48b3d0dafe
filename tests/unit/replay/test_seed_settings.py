"""The backtest honours the settings' seeds unless ``--seed`` is given.

Found by the settings tour: ``STREAMREC_MODEL__SEED=7 streamrec replay backtest ...`` ran
with seed 0, its report (digest and figures) the default run's to the bit, and recorded
``model.seed: 0``: the ``--seed`` flag's default replaced both seeds (the negative sampler's,
``STREAMREC_CONSUMER__SEED``, and the model's) whether given or not.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import load_config
from streamrec.replay import backtest as bt

SOURCE = "synthetic:events=300,users=20,items=100,seed=3"


def test_without_a_seed_the_settings_seeds_are_kept() -> None:
    settings = load_config(model={"seed": 7}, consumer={"seed": 5})
    seeded = bt.seeded(bt.BacktestConfig(SOURCE, settings=settings))
    assert (seeded.model.seed, seeded.consumer.seed) == (7, 5)


def test_a_seed_given_sets_both() -> None:
    settings = load_config(model={"seed": 7}, consumer={"seed": 5})
    seeded = bt.seeded(bt.BacktestConfig(SOURCE, seed=2, settings=settings))
    assert (seeded.model.seed, seeded.consumer.seed) == (2, 2)


@pytest.mark.parametrize(("env", "flag", "seed"), [({"STREAMREC_MODEL__SEED": "7"}, [], 7),
                                                   ({"STREAMREC_MODEL__SEED": "7"}, ["--seed", "2"], 2)])
def test_the_backtest_runs_with_the_seed_of_its_settings_or_flag(
    env: dict[str, str], flag: list[str], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def record(cfg: bt.BacktestConfig, *_: object) -> dict[str, object]:
        seen.append(bt.seeded(cfg).model.seed)
        raise SystemExit(0)

    monkeypatch.setattr(bt, "backtest", record)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = CliRunner().invoke(app, ["replay", "backtest", SOURCE, *flag])
    assert seen == [seed], out.output
