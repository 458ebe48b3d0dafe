"""Helpers shared by test modules (fixtures live in the conftest files)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from streamrec.snapshots.store import SnapshotStore


# The engine `streamrec serve` runs a fresh export with (engine "auto"): ONNX Runtime where the
# onnx extra is installed (exports then hold model.onnx), else Paddle Inference.
SERVED_ENGINE = (
    "onnx" if all(importlib.util.find_spec(m) for m in ("onnxruntime", "paddle2onnx")) else "paddle"
)


def small_tables(
    item_rows: int = 2**14, category_rows: int = 2**12, dim: int = 16, **table: Any
) -> list[dict[str, Any]]:
    """Item and category embedding tables small enough for quick tests (``ModelConfig.tables``);
    ``table`` sets more fields of both (``ids="hashed"``, ``min_count``...).
    """
    return [
        {"name": "item", "feature": "item", "rows": item_rows, "dim": dim, **table},
        {"name": "category", "feature": "category", "rows": category_rows, "dim": dim, **table},
    ]


def trained_snapshots(
    root: Path, count: int = 2, seed: int = 0, learner: str = "din", full_every: int = 1
) -> SnapshotStore:
    """A snapshot directory with ``count`` versions of a small DIN (or the built-in ``learner``
    named), each trained on one more window of generated clicks, every one exported; nothing
    promoted. Every ``full_every``-th version is full, the ones between deltas.
    """
    import numpy as np

    from streamrec.config import ModelConfig
    from streamrec.learner.columns import SampleColumns
    from streamrec.learner.registry import make_learner
    from streamrec.learner.snapshotting import group_state
    from streamrec.samples import Sample
    from streamrec.serving.export import export_snapshot
    from streamrec.snapshots.store import SnapshotStore

    cfg = ModelConfig.model_validate({
        "tables": small_tables(512, 64, dim=4), "sequence_length": 6, "attention_units": (8,),
        "mlp_units": (8,), "train_batch_size": 32, "device": "cpu", "learning_rate": 0.01, "seed": seed,
        "learner": learner,
    })
    model, store = make_learner(cfg), SnapshotStore(root, full_every=full_every)
    rng = np.random.default_rng(seed)
    for k in range(count):
        samples = []
        for n in range(400):
            item = int(rng.integers(40))
            history = tuple(f"i{int(x)}" for x in rng.integers(40, size=3))
            samples.append(Sample(
                f"s{k}-{n}", f"u{rng.integers(30)}", k * 10_000 + n, f"i{item}", f"c{item % 5}",
                int((item % 2 == 0) == (rng.random() < 0.8)), history, tuple("c0" for _ in history),
            ))
        model.learn_many(SampleColumns.from_samples(samples))
        manifest = store.write(
            group_state(model.state_arrays()), micro_batches=k + 1, samples_trained=400 * (k + 1),
            positions=(), config={"model": cfg.model_dump(mode="json")},
        )
        export_snapshot(store, manifest.version)
    return store


def decoder_agreement(
    base: dict[str, Any],
    odd: list[Any],
    parse: Callable[[bytes], Any],
    checked: Callable[[bytes], Any],
    decoder: msgspec.json.Decoder[Any],
    error: type[Exception],
) -> int:
    """Replace the fields of ``base`` by each ``odd`` value (``...`` removes the field), one at
    a time and in random pairs, and assert that ``parse`` (the C decoder first) and ``checked``
    (field by field) give the same value or raise ``error`` with the same reason on every
    record. Returns how many records the decoder took by itself.
    """

    def outcome(raw: bytes, parser: Callable[[bytes], Any]) -> Any:
        try:
            return parser(raw)
        except error as exc:
            return str(exc)

    cases = [{name: value} for name in base for value in odd]
    rng = random.Random(5)
    cases += [dict(rng.sample(list(case.items()) + list(rng.choice(cases).items()), 2)) for case in cases * 3]
    fast = 0
    for over in cases:
        values = {**base, **over}
        raw = json.dumps({k: v for k, v in values.items() if v is not ...}).encode()  # escapes "\ud800"
        slow = outcome(raw, checked)
        assert outcome(raw, parse) == slow, over
        try:
            fast += decoder.decode(raw) == slow
        except msgspec.MsgspecError:
            pass
    return fast


def _recording_learner_base() -> type:
    from streamrec.learner.din import DINLearner

    return DINLearner


class RecordingLearner(_recording_learner_base()):  # type: ignore[misc]
    """A DIN that records the id of every sample it trains on, in order (``trained``), whole
    micro-batches and parts alike; sets ``in_step`` when a training step begins and, given a
    ``gate``, waits for it (up to a minute) before training, so a test can act while a step runs.
    """

    def __init__(self, cfg: Any, gate: Any = None) -> None:
        super().__init__(cfg)
        self.trained: list[str] = []
        self.in_step = threading.Event()
        self._gate = gate

    def learn_many(self, batch: Any) -> Any:
        self._step_begins(batch)
        return super().learn_many(batch)

    def learn_part(self, batch: Any) -> Any:
        self._step_begins(batch)
        return super().learn_part(batch)

    def _step_begins(self, batch: Any) -> None:
        self.in_step.set()
        if self._gate is not None:
            self._gate.wait(60)
        self.trained += batch.sample_ids


def recording_learner_main(config_file: str, trained_file: str) -> None:
    """Run a learner on the config in ``config_file`` (JSON) until it stops; write the sample
    ids it trained to ``trained_file`` (JSON), atomically.
    """
    from streamrec.config import StreamrecConfig
    from streamrec.learner.runner import LearnerRunner

    logging.basicConfig(level=logging.INFO)
    cfg = StreamrecConfig.model_validate_json(Path(config_file).read_text())
    learner = RecordingLearner(cfg.model)
    LearnerRunner(cfg, learner).run()
    tmp = Path(f"{trained_file}.tmp")
    tmp.write_text(json.dumps(learner.trained))
    tmp.replace(trained_file)


@contextlib.contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """``app`` on uvicorn on a free port in a thread of this process; yields its base URL."""
    import uvicorn

    from streamrec.local.ports import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)



def in_thread(run: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``run()`` started on a thread; what it returns or raises lands in the list."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(run())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def running(processes: Iterable[Any]) -> list[Any]:
    """Those of ``processes`` (psutil's) still running: a zombie has exited, a reaped one is gone."""
    import psutil  # type: ignore[import-untyped]

    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def paddle_handlers_set(pid: int) -> bool:
    """Whether Paddle's import has set its C++ signal handlers in process ``pid``.

    That is: SIGSEGV is caught (Paddle's handler is the only one on it in streamrec's processes)
    and libpaddle is mapped, in a process running a command line of its own. Between fork and
    exec a child is a copy of its parent, with the parent's handlers, libraries and command line:
    a server process, or multiprocessing's resource tracker, being started by a command that has
    Paddle loaded. Its command line is read first: once it differs from the parent's, the child
    has exec'd, and what is read after it is its own.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
        maps = Path(f"/proc/{pid}/maps").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if cmdline == Path(f"/proc/{int(fields['PPid'])}/cmdline").read_bytes():
            return False  # forked, not yet exec'd (or never)
    except OSError:
        return False
    caught = int(fields["SigCgt"], 16)
    return bool(caught & (1 << (signal.SIGSEGV - 1))) and "libpaddle" in maps


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll ``condition`` every 50 ms until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s}s"
        time.sleep(0.05)


if __name__ == "__main__":
    import sys

    recording_learner_main(sys.argv[1], sys.argv[2])
