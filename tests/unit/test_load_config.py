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
