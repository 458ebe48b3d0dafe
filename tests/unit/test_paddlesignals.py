"""SIGINT and SIGTERM kept from Paddle's import: held back through it, their handlers put back."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from streamrec.launch import quiet_defaults
from streamrec.paddlesignals import stop_signals_kept


@pytest.fixture
def got() -> Iterator[list[str]]:
    saved = signal.getsignal(signal.SIGTERM)
    seen: list[str] = []
    signal.signal(signal.SIGTERM, lambda *_: seen.append("before"))
    yield seen
    signal.signal(signal.SIGTERM, saved)


def test_a_sigterm_sent_meanwhile_reaches_the_handler_from_before_once_the_block_ends(got: list[str]) -> None:
    with stop_signals_kept():
        signal.signal(signal.SIGTERM, lambda *_: got.append("paddle"))  # as Paddle's import does
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        assert got == []  # held back
    assert got == ["before"]
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_an_error_in_the_block_still_puts_the_handlers_back(got: list[str]) -> None:
    with pytest.raises(ImportError), stop_signals_kept():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise ImportError("paddle")
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
    assert got == ["before"]


def test_streamrec_launch_is_paddles_launcher_on_the_same_arguments() -> None:
    """``python -m streamrec.launch`` (``learner run --workers N`` starts it) takes Paddle's launcher's
    arguments and prints no ccache warning. Its stop handlers: tests/integration/test_stop_signals.py.
    """
    done = subprocess.run(
        [sys.executable, "-m", "streamrec.launch", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "--nproc_per_node" in done.stdout, done.stderr[-2000:]
    assert "ccache" not in done.stderr, done.stderr[-2000:]


def test_streamrec_launch_leaves_paddles_start_up_chatter_out_unless_asked() -> None:
    http = logging.getLogger("httpx")  # the launcher's client of its master, across hosts
    before = http.level
    try:
        http.setLevel(logging.NOTSET)
        argv, env = ["launch.py", "--nproc_per_node", "2", "streamrec"], {"PATH": "/bin"}
        quiet_defaults(argv, env)
        assert argv == ["launch.py", "--log_level", "WARNING", "--nproc_per_node", "2", "streamrec"]
        assert env == {"PATH": "/bin", "GLOG_minloglevel": "1"}
        assert http.level == logging.WARNING
        for asked in (["launch.py", "--log_level=DEBUG", "streamrec"],
                      ["launch.py", "--log_level", "INFO", "x"]):
            http.setLevel(logging.NOTSET)
            argv, env = list(asked), {"GLOG_minloglevel": "0"}
            quiet_defaults(argv, env)
            assert argv == asked and env == {"GLOG_minloglevel": "0"} and http.level == logging.NOTSET
    finally:
        http.setLevel(before)


def test_signal_each_rank_once_leaves_a_launcher_laid_out_otherwise_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Paddle is not pinned (>=3.0): a launcher without ProcessContext.terminate keeps its own way
    from paddle.distributed.launch.utils import process_context

    from streamrec.launch import signal_each_rank_once

    monkeypatch.delattr(process_context.ProcessContext, "terminate")
    with caplog.at_level(logging.WARNING, "streamrec.launch"):
        signal_each_rank_once()
    assert "no ProcessContext.terminate" in caplog.text


@pytest.mark.parametrize(
    "entry",
    [
        "import streamrec; from streamrec.learner import DINLearner; "
        "DINLearner(streamrec.load_config().model)",
        "import streamrec.serving.export",
        "from streamrec.replay import BacktestConfig; from streamrec.replay.backtest import backtest; "
        "backtest(BacktestConfig('synthetic:events=300', strategies=('finetune',)))",
    ],
)
def test_a_library_user_keeps_the_root_logger_as_it_was_through_paddles_import(entry: str) -> None:
    """Paddle's import adds an INFO StreamHandler to the root logger (paddle.distributed's
    ``get_logger(name="root")``): a notebook that only imports streamrec would then print every
    library's INFO records. The library puts the root logger's handlers and level back.
    """
    code = (
        "import logging, sys\n"
        f"{entry}\n"
        "assert 'paddle' in sys.modules\n"
        "root = logging.getLogger()\n"
        "print(root.handlers, logging.getLevelName(root.level), root.propagate)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[] WARNING True", done.stdout


def test_a_library_user_sees_no_ccache_warning_and_keeps_their_warning_filters() -> None:
    """Paddle's import warns that ccache is missing (it only builds C++ extensions): noise in every
    program that imports `DINLearner`. The CLI filters it process-wide; the library silences it
    for that import only, leaving the program's filters (and those Paddle's import adds).
    """
    code = (
        "import warnings\n"
        "warnings.simplefilter('default')\n"
        "before = list(warnings.filters)\n"
        "from streamrec.learner import DINLearner\n"
        "import paddle\n"
        "assert all(f in warnings.filters for f in before), 'filters removed'\n"
        "assert not [f for f in warnings.filters if f[1] is not None and 'ccache' in f[1].pattern], 'left'\n"
        "warnings.warn('No ccache found, said later')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ccache" not in done.stderr.replace("No ccache found, said later", ""), done.stderr[-2000:]
    assert "No ccache found, said later" in done.stderr  # the filter was the import's only
