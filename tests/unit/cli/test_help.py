"""Every command's --help: docstrings reflowed to the terminal, nothing of them lost."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from streamrec.cli import app


def commands(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group under ``streamrec``, with its path of names."""
    command = command or get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


ALL = list(commands())


def help_of(path: tuple[str, ...], width: int) -> str:
    # rich reads the width from COLUMNS
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.output


def words(text: str) -> list[str]:
    """The words of a help or a docstring: box drawing and backticks (code spans) left out."""
    return re.sub(r"[│╭╮╰╯─]", " ", text).replace("`", "").split()


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "streamrec" for p, _ in ALL])
def test_help_shows_every_word_of_its_docstring_and_options(path: tuple[str, ...], command: Any) -> None:
    shown = set(words(help_of(path, 100)))
    texts = [command.help or ""] + [param.help for param in command.params if getattr(param, "help", None)]
    for text in texts:
        missing = [word for word in words(text) if word not in shown]
        assert not missing, f"{' '.join(path)} --help lost {missing} (markdown took them for markup?)"


def lines_of(text: str) -> list[str]:
    """The lines of a help as their words, one space apart."""
    return [" ".join(words(line)) for line in text.splitlines()]


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "streamrec" for p, _ in ALL])
def test_docstrings_wrapped_in_the_source_are_reflowed_in_help(path: tuple[str, ...], command: Any) -> None:
    # wide enough for any paragraph on one line: a break inside one is the source's
    paragraphs = [" ".join(words(p)) for p in (command.help or "").split("\n\n") if p.strip()]
    own = lines_of(help_of(path, 400))
    for paragraph in paragraphs:
        assert paragraph in own, f"{' '.join(path)} --help breaks a paragraph where the source does"
    if path:  # and the parent's list of commands shows the first paragraph whole
        listing = lines_of(help_of(path[:-1], 400))
        assert any(paragraphs[0] in line for line in listing), f"{' '.join(path[:-1])} --help"
