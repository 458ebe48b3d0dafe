"""``load_config`` from Python: the settings file may be named by a string, as by a Path.

Found by the Python-API tour (test first): ``load_config("streamrec.toml")``, the natural call in a
notebook, raised AttributeError "'str' object has no attribute 'is_dir'" for a file there or not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrec import load_config
from streamrec.errors import ConfigError


def test_a_settings_file_named_by_a_string_is_read(tmp_path: Path) -> None:
    path = tmp_path / "streamrec.toml"
    path.write_text("[consumer]\nbatch_size = 321\n")
    assert load_config(str(path)).consumer.batch_size == 321


def test_a_missing_settings_file_named_by_a_string_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist: give an existing TOML file"):
        load_config(str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="is a directory: give a TOML file"):
        load_config(str(tmp_path))


@pytest.mark.parametrize("given", [5, 1.5, b"streamrec.toml", ["streamrec.toml"]])
def test_a_settings_file_that_is_no_path_is_a_type_error_naming_the_argument(given: object) -> None:
    """Found by the Python-API tour, left: ``load_config(5)`` raised ``TypeError: expected str, bytes
    or os.PathLike object, not int`` from inside pathlib, naming no argument.
    """
    with pytest.raises(TypeError, match=r"load_config's toml_file must be a path \(a str or a Path\), not "):
        load_config(given)  # type: ignore[arg-type]  # the wrong type is the point


def test_a_bad_override_is_said_to_come_from_load_configs_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the Python-API tour, left: a bad override was "(from its flag)", a flag a program
    calling ``load_config`` never gave; and a variable alone "(from the environment or its flag)".
    The commands still say "its flag" (``tests/unit/cli/test_config_errors.py``).
    """
    monkeypatch.delenv("STREAMREC_CONSUMER__BATCH_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"BATCH_SIZE \(from load_config's argument\): Input should be"):
        load_config(consumer={"batch_size": 0})
    monkeypatch.setenv("STREAMREC_CONSUMER__BATCH_SIZE", "0")
    with pytest.raises(ConfigError, match=r"BATCH_SIZE \(from the environment\): Input should be"):
        load_config()
    with pytest.raises(ConfigError, match=r"BATCH_SIZE \(from the environment or load_config's argument\)"):
        load_config(consumer={"batch_size": 0})
