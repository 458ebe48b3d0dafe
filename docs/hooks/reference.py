"""MkDocs hook: reference pages generated from the code at build time, so they cannot drift.

- ``reference/configuration.md`` from the pydantic settings in `streamrec.config`: every
  field of every section (nested models and the store's variants included), its env name,
  type, default, description and the comment above it in the source (why that default).
- ``reference/cli.md`` from the Typer app in `streamrec.cli`: every command, its usage,
  help and options, as ``--help`` has them.
- ``benchmarks-history.md`` from ``bench/HISTORY.md``, the log of earlier figures.

A hook rather than a plugin (mkdocs-gen-files): the same in-memory pages through MkDocs's own
``File.generated`` API, with no dependency to keep. Nothing generated is committed.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "STREAMREC_"
# Options every Typer app has, not ours to document.
SKIP = {"help", "install_completion", "show_completion"}


# ---------------------------------------------------------------- configuration reference


def _rst(text: str) -> str:
    """Sphinx roles (```x` ``) as plain code spans."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return _rst(text).replace("|", "\\|").replace("\n", " ").strip()


def _type_name(annotation: Any) -> str:
    """An annotation as a reader writes it: ``int | None``, ``"a" | "b"``, ``list[str]``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin in (tuple, list):
        inner = [a for a in args if a is not Ellipsis]
        return f"list[{_type_name(inner[0])}]" if inner else "list"
    if origin is dict:
        return "JSON object"
    if isinstance(annotation, type):
        if issubclass(annotation, Enum):
            return " | ".join(json.dumps(m.value) for m in annotation)
        return {"str": "string", "Path": "path", "bool": "bool"}.get(annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "*(required)*"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "*(required)*"

    def plain(v: Any) -> Any:
        if isinstance(v, BaseModel):
            return v.model_dump(mode="json", exclude_defaults=True)
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        if isinstance(v, Path):
            return str(v)
        return v

    return f"`{json.dumps(plain(value), ensure_ascii=False)}`"


def _comments(cls: type) -> dict[str, str]:
    """Field name -> the ``#`` comment lines right above its line in the class body."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^    ([a-z_][a-z0-9_]*)\s*:", line)
        if match and pending:
            found[match.group(1)] = " ".join(pending)
        if stripped:
            pending = []
    return found


def _description(env: str, field: Any) -> str:
    text = (field.description or "").strip()
    if text.startswith(env):
        text = text[len(env) :].lstrip(" :")
    return text


def _models(annotation: Any) -> list[type]:
    """The pydantic models an annotation holds: one section, or a union's variants."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type] = []
    for arg in typing.get_args(annotation):
        found.extend(_models(arg))
    return found


def _row(name: str, env: str, field: Any, comments: dict[str, str]) -> str:
    why = comments.get(name, "")
    what = _description(env, field)
    text = " ".join(x for x in (what, f"*Why:* {why}" if why else "") if x)
    return f"| `{env}` | {_cell(_type_name(field.annotation))} | {_cell(_default(field))} | {_cell(text)} |"


def _sections(out: list[str], annotation: Any, env: str) -> None:
    """A section's page part, or one for each variant of a union (the store's ``type``)."""
    arms = _models(annotation)
    if len(arms) == 1:
        _section(out, arms[0], f"{env}__", f"`{env}__*`")
        return
    for arm in arms:
        kind = arm.model_fields["type"].default  # type: ignore[attr-defined]
        _section(out, arm, f"{env}__", f"`{env}__*` with `{env}__TYPE={kind}`")


def _section(out: list[str], model: type, env_prefix: str, title: str) -> None:
    from streamrec.config.loading import is_section

    out += [f"## {title}", ""]
    doc = _rst(inspect.getdoc(model) or "")
    if doc:
        out += [doc, ""]
    comments = _comments(model)
    rows: list[str] = []
    nested: list[tuple[Any, str]] = []
    item_models: list[tuple[str, type]] = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        env = f"{env_prefix}{name.upper()}"
        if is_section(field.annotation):
            nested.append((field.annotation, env))
            continue
        if _models(field.annotation):  # a list of objects, as STREAMREC_MODEL__TABLES
            item_models.append((env, _models(field.annotation)[0]))
        rows.append(_row(name, env, field, comments))
    if rows:
        out += ["| env | type | default | description |", "|---|---|---|---|", *rows, ""]
    for env, model_type in item_models:
        out += [f"Each entry of `{env}` (a JSON list of objects) has these keys:", ""]
        _keys(out, model_type)
    for annotation, env in nested:
        _sections(out, annotation, env)


def _keys(out: list[str], model: type) -> None:
    doc = _rst(inspect.getdoc(model) or "")
    if doc:
        out += [doc, ""]
    comments = _comments(model)
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        text = " ".join(x for x in ((field.description or "").strip(), comments.get(name, "")) if x)
        kind, default = _cell(_type_name(field.annotation)), _cell(_default(field))
        out.append(f"| `{name}` | {kind} | {default} | {_cell(text)} |")
    out.append("")


def configuration_page() -> str:
    """The configuration reference, walked from `streamrec.config.StreamrecConfig`."""
    from streamrec import config
    from streamrec.config.loading import is_section

    out = [
        "# Configuration reference",
        "",
        "*Generated from `streamrec/config/` at every docs build: it cannot drift from the code.*",
        "",
        _rst(inspect.getdoc(config) or ""),
        "",
        "Each setting comes from a CLI flag, a `STREAMREC_*` environment variable, or `streamrec.toml`",
        "in the working directory, in that order of precedence. Lists and objects are JSON in an",
        "environment variable; `null` unsets an optional setting. A setting that cannot be read stops",
        "the command with one line naming it. *Why* is the comment beside the default in the source.",
        "A duration in seconds (a setting ending in `_S`) takes at most a century, 3,153,600,000 s:",
        "longer ones overflowed the socket and thread waits and the Redis expiries they reach.",
        "",
    ]
    top = config.StreamrecConfig
    comments = _comments(top)
    rows = [
        _row(name, f"{PREFIX}{name.upper()}", field, comments)
        for name, field in top.model_fields.items()
        if not is_section(field.annotation)
    ]
    out += ["## Top level", "", "| env | type | default | description |", "|---|---|---|---|", *rows, ""]
    for name, field in top.model_fields.items():
        if is_section(field.annotation):
            _sections(out, field.annotation, f"{PREFIX}{name.upper()}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- CLI reference


def _param_type(param: Any) -> str:
    """What an option takes: from its annotation where Typer keeps one, else click's type."""
    if getattr(param, "is_bool_flag", False) or getattr(param, "is_flag", False):
        return "flag"
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        return _type_name(descriptor.annotation).replace(" | null", "")
    kind = getattr(param, "type", None)
    return str(getattr(kind, "name", kind or ""))


def _option_row(param: Any) -> str:
    is_argument = param.param_type_name == "argument"
    names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    if is_argument:
        names = f"`{(param.name or '').upper()}` (argument{'' if param.required else ', optional'})"
    kind = _param_type(param)
    default = param.default
    if callable(default) or default is None or default == () or is_argument:
        shown = "*(required)*" if param.required else ""
    elif isinstance(default, bool):
        flag = param.opts[0] if default else (param.secondary_opts or param.opts)[0]
        shown = f"`{flag}`" if param.secondary_opts else f"`{str(default).lower()}`"
    else:
        shown = f"`{default}`"
    envvar = param.envvar
    envs = [envvar] if isinstance(envvar, str) else list(envvar or [])
    env = ", ".join(f"`{e}`" for e in envs)
    help_text = getattr(param, "help", None) or ""
    return f"| {names} | {_cell(kind)} | {_cell(shown)} | {_cell(env)} | {_cell(help_text)} |"


def _command(out: list[str], cmd: Any, ctx: Any, path: str, depth: int) -> None:
    if getattr(cmd, "hidden", False):
        return
    out += [f"{'#' * min(depth, 4)} `{path}`", ""]
    if cmd.help:
        out += [_rst(inspect.cleandoc(cmd.help)), ""]
    usage = cmd.get_usage(ctx).replace("Usage: ", "", 1)
    out += ["```text", usage, "```", ""]
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False) and p.name not in SKIP]
    if params:
        out += ["| option | type | default | env | description |", "|---|---|---|---|---|"]
        out += [_option_row(p) for p in params]
        out.append("")
    if hasattr(cmd, "list_commands"):  # a group (Typer ships its own copy of click's classes)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None:
                _command(out, sub, type(ctx)(sub, info_name=name, parent=ctx), f"{path} {name}", depth + 1)


def cli_page() -> str:
    """The CLI reference, walked from the Typer app in `streamrec.cli`."""
    import typer

    from streamrec.cli import app

    root = typer.main.get_command(app)
    out = [
        "# CLI reference",
        "",
        "*Generated from the Typer app in `streamrec/cli/` at every docs build: the same options",
        "`streamrec COMMAND --help` prints.* A flag given on the command line wins over its",
        "environment variable and `streamrec.toml` (see the [configuration reference](configuration.md));",
        "a flag whose setting may be unset (its default `null`) takes `null` too, for one run.",
        "",
    ]
    _command(out, root, root.context_class(root, info_name="streamrec"), "streamrec", 2)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the hook


def history_page() -> str:
    """``bench/HISTORY.md``, with its links made to work from the site."""
    text = (ROOT / "bench" / "HISTORY.md").read_text()
    return text.replace("](../README.md)", "](index.md)")


PAGES = {
    "reference/configuration.md": configuration_page,
    "reference/cli.md": cli_page,
    "benchmarks-history.md": history_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages to the site."""
    for uri, render in PAGES.items():
        files.append(File.generated(config, uri, content=render()))
    return files
