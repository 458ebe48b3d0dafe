"""``--dump-samples``: the exact samples of every micro-batch, once each, with its index."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.replay.backtest import BacktestConfig, micro_batches, seeded
from streamrec.samples import Sample
from tests.unit.replay.test_backtest import SOURCE


def test_the_dump_holds_every_sample_once_with_its_micro_batch(tmp_path: Path) -> None:
    path = tmp_path / "out" / "samples.jsonl"
    out = CliRunner().invoke(app, [
        "replay", "backtest", SOURCE, "--batch-size", "800", "--strategies", "popularity",
        "--dump-samples", str(path),
    ])
    assert out.exit_code == 0, out.output
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    cfg = BacktestConfig(source=SOURCE, batch_size=800)  # the CLI's default settings
    _, batches = micro_batches(cfg, seeded(cfg))
    expected = [(b.index, s) for b in batches for s in b.samples]
    got = [(line["micro_batch"], Sample.from_json(orjson.dumps(line["sample"]))) for line in lines]
    assert got == expected and len({s.sample_id for _, s in got}) == len(got)
    assert [p.name for p in path.parent.iterdir()] == ["samples.jsonl"]  # no temporary left behind
