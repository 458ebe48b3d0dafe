"""Reading the configuration, and naming a bad setting by its env variable in one line."""

from __future__ import annotations

import json
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import SettingsConfigDict, SettingsError

from streamrec.config.settings import StreamrecConfig
from streamrec.config.store import STORE_TYPES
from streamrec.errors import ConfigError

PREFIX = "STREAMREC_"
# Environment variables of the prefix that are not settings: fault injection and the test
# data folder.
NOT_SETTINGS = frozenset({"STREAMREC_FAULT", "STREAMREC_FAULT_MODE", "STREAMREC_SHARED_DATA"})


def load_config(toml_file: str | Path | None = None, **overrides: Any) -> StreamrecConfig:
    """Build the config; ``overrides`` are nested dicts by section (``kafka={"partitions": 2}``).

    A section given here is merged over what env and TOML say for that section. The TOML file
    is ``toml_file`` when given (it must exist), else ``./streamrec.toml`` if there is one.

    Raises:
        ConfigError: A setting is invalid; the message names its env variable and where it was
            set (``from load_config's argument`` for an override).
        TypeError: ``toml_file`` is not a path (a str or a Path).

    Examples:
        >>> load_config(consumer={"batch_size": 500}).consumer.batch_size
        500
        >>> load_config(consumer={"batch_size": 0})
        Traceback (most recent call last):
        ...
        streamrec.errors.ConfigError: invalid setting STREAMREC_CONSUMER__BATCH_SIZE ...
    """
    if toml_file is not None and not isinstance(toml_file, str | os.PathLike):
        raise TypeError(f"load_config's toml_file must be a path (a str or a Path), not {toml_file!r}")
    return load_settings(toml_file, overrides, by="load_config's argument")


def load_settings(toml_file: str | Path | None, overrides: Mapping[str, Any], by: str) -> StreamrecConfig:
    """`load_config`, its overrides named ``by`` in an error (a command's: ``its flag``)."""
    toml_file = None if toml_file is None else Path(toml_file)  # a str too, as a notebook gives it
    toml_path = Path(toml_file or str(StreamrecConfig.model_config.get("toml_file")))
    unknown = unknown_variables(os.environ)
    if unknown:
        wholes = sorted({above for name in unknown if (above := whole_setting_above(name)) is not None})
        raise ConfigError(
            f"{', '.join(unknown)} names no setting: check the spelling (a section and its setting "
            "are joined by __; docs/reference/configuration.md lists them) or unset it"
            + "".join(f"; {above} is one setting: give its whole value, as JSON" for above in wholes)
        )
    try:
        if toml_file is not None and toml_file.is_dir():
            raise ConfigError(f"the settings file {toml_file} is a directory: give a TOML file")
        if toml_file is not None and not toml_file.exists():
            raise ConfigError(f"the settings file {toml_file} does not exist: give an existing TOML file")
        if toml_file is not None and not toml_file.is_file():  # the reader skips what is not a file
            raise ConfigError(
                f"the settings file {toml_file} is not a regular file (a device or a pipe): give a TOML file"
            )
        base = StreamrecConfig() if toml_file is None else _reading(toml_file)()
        if not overrides and toml_file is None:
            return base
        merged = base.model_dump()
        for section, values in overrides.items():
            current = merged.get(section)
            # A section that switches its type (the store) starts afresh instead of merging.
            if (
                isinstance(values, dict)
                and isinstance(current, dict)
                and values.get("type", current.get("type")) == current.get("type")
            ):
                merged[section] = {**current, **values}
            else:
                merged[section] = values
        return StreamrecConfig.model_validate(merged)
    except ValidationError as exc:
        given = {"overrides": overrides, "toml": toml_path, "by": by}
        raise ConfigError("; ".join(_setting_error(error, given) for error in exc.errors())) from exc
    except SettingsError as exc:
        raise _source_error(exc) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{toml_path.resolve()} is not valid TOML: {exc}: fix the file") from exc


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The variables of the prefix in ``environ`` that name no setting (typos, left unread).

    Examples:
        >>> unknown_variables({"STREAMREC_CONSUMER__BATCH_SIZE": "5", "STREAMREC_CONSUMR__X": "1"})
        ['STREAMREC_CONSUMR__X']
    """
    return sorted(
        name for name in environ
        if name.upper().startswith(PREFIX) and name.upper() not in NOT_SETTINGS and not is_setting(name)
    )


def is_setting(env: str) -> bool:
    """Whether ``env`` (``STREAMREC_SECTION__NAME``, any case) names a setting.

    Only a section's settings are named by ``__``; a setting whose value is a list or mapping
    (``STREAMREC_FEATURES``, ``STREAMREC_KAFKA__CLIENT``) is set whole, so a name below it
    (``STREAMREC_FEATURES__NAME``) is none.

    Examples:
        >>> is_setting("STREAMREC_KAFKA__BOOTSTRAP_SERVERS"), is_setting("STREAMREC_KAFKA__BOOTSTRAP_SERVER")
        (True, False)
        >>> is_setting("STREAMREC_FEATURES"), is_setting("STREAMREC_FEATURES__NAME")
        (True, False)
    """
    return _annotation(env) is not _NO_FIELD


def whole_setting_above(env: str) -> str | None:
    """The setting set whole (a list or mapping) that ``env`` names a part of, if any.

    Examples:
        >>> whole_setting_above("STREAMREC_MODEL__TABLES__ROWS"), whole_setting_above("STREAMREC_KAFKA__X")
        ('STREAMREC_MODEL__TABLES', None)
    """
    parts = env.upper().split("__")
    for end in range(len(parts) - 1, 0, -1):
        above = "__".join(parts[:end])
        annotation = _annotation(above)
        if annotation is not _NO_FIELD and not is_section(annotation):
            return above
    return None


_NO_FIELD = object()  # what `_annotation` gives for a name that is no setting


def _annotation(env: str) -> Any:  # noqa: ANN401 - an annotation
    """The annotation of the field ``env`` names, through sections only; else `_NO_FIELD`."""
    fields = fields_of(StreamrecConfig)
    *sections, name = env.upper().removeprefix(PREFIX).lower().split("__")
    for section in sections:
        if not is_section(fields.get(section)):
            return _NO_FIELD
        fields = fields_of(fields[section])
    return fields.get(name, _NO_FIELD)


def is_section(annotation: Any) -> bool:  # noqa: ANN401 - an annotation
    """Whether a field of this annotation is a section, its settings named each on its own.

    A section is a model or a union of models; a list of models or a mapping is one setting.
    """
    return bool(fields_of(annotation)) and typing.get_origin(annotation) not in (tuple, list)


def fields_of(model: Any) -> dict[str, Any]:  # noqa: ANN401 - a model class or an annotation
    """Field name -> its annotation, for a settings model or a union of section models."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return {name: f.annotation for name, f in model.model_fields.items()}
    merged: dict[str, Any] = {}
    for arm in getattr(model, "__args__", ()):  # Annotated[...] and unions of sections
        merged.update(fields_of(arm))
    return merged


def _reading(toml_file: Path) -> type[StreamrecConfig]:
    """The configuration class, reading ``toml_file`` instead of ``./streamrec.toml``.

    `load_config` validates the result again as a `StreamrecConfig`.
    """

    class FromFile(StreamrecConfig):
        model_config = SettingsConfigDict(toml_file=toml_file)

    return FromFile


def env_name(loc: tuple[int | str, ...]) -> str:
    """The env var of a setting at ``loc`` (pydantic's error location).

    ``("consumer", "batch_size")`` is ``STREAMREC_CONSUMER__BATCH_SIZE``; a list or a mapping is
    set whole, so a place in it is named by its variable and the item or key.

    Examples:
        >>> env_name(("consumer", "batch_size"))
        'STREAMREC_CONSUMER__BATCH_SIZE'
        >>> env_name(("model", "tables", 0, "rows"))
        'STREAMREC_MODEL__TABLES (item 0 rows)'
        >>> env_name(("kafka", "topic_config", "min.insync.replicas"))
        "STREAMREC_KAFKA__TOPIC_CONFIG (key 'min.insync.replicas')"
    """
    parts, end = _setting_parts(loc)
    name = "STREAMREC_" + "__".join(str(part).upper() for part in parts[:end])
    inside = parts[end:]
    if not inside:
        return name
    first = f"item {inside[0]}" if isinstance(inside[0], int) else f"key {inside[0]!r}"
    return f"{name} ({' '.join([first, *map(str, inside[1:])])})"


def _setting_parts(loc: tuple[int | str, ...]) -> tuple[list[int | str], int]:
    """``loc`` without the store's union tag, and where the setting's name ends in it."""
    parts = list(loc)
    if parts[:1] == ["store"] and parts[1:2] in (["redis"], ["memory"]):
        del parts[1]  # the discriminated union's tag is no setting
    fields, end = fields_of(StreamrecConfig), 0
    while end < len(parts) and isinstance(parts[end], str) and parts[end] in fields:
        annotation, end = fields[str(parts[end])], end + 1
        if not is_section(annotation):
            break  # a setting: what follows is a place inside it
        fields = fields_of(annotation)
    return parts, end


def _origin(loc: tuple[int | str, ...], given: Mapping[str, Any]) -> str:
    """Where the bad value at ``loc`` came from: an override, the environment or the settings file.

    ``given["by"]`` names the overrides: ``its flag`` for a command's, whose flag's value arrives
    with the variable's when only the variable is set (the CLI reads both), so a variable that
    is set is named with the flag; ``load_config's argument`` for a program's. The generic
    wording where none of them holds it.
    """
    parts, end = _setting_parts(loc)
    named = end + 1 if end < len(parts) and isinstance(parts[end], str) else end  # an unknown key too
    path = [str(part) for part in parts[:named]]
    overrides, by = given.get("overrides", {}), given.get("by", "its flag")
    variable = "STREAMREC_" + "__".join(path[:end]).upper()
    raw = {name.upper(): value for name, value in os.environ.items()}.get(variable)
    held = _holds(overrides, path)
    if raw is not None and (not held or _alike(_value_at(overrides, path), raw)):
        return f"from the environment or {by}" if held or by == "its flag" else "from the environment"
    if held:
        return f"from {by}"
    toml_path = given.get("toml")
    if isinstance(toml_path, Path) and toml_path.is_file():
        try:
            data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            data = {}
        if _holds(data, path):
            section = f"[{'.'.join(path[:-1])}] " if len(path) > 1 else ""
            return f"from {toml_path.resolve()} {section}{path[-1]}"
    return f"or {by} or streamrec.toml entry"


def _value_at(data: Any, path: list[str]) -> Any:  # noqa: ANN401 - parsed TOML or overrides
    """The value at ``path`` in the nested mapping ``data`` (which `_holds`)."""
    for key in path:
        data = data[key]
    return data


def _alike(value: Any, raw: str) -> bool:  # noqa: ANN401 - a flag's parsed value
    """Whether a flag's ``value`` is the variable's ``raw`` text, as the CLI parsed it.

    Examples:
        >>> _alike(-1.0, "-1"), _alike(-1, "3"), _alike("", "")
        (True, False, True)
    """
    if str(value) == raw:
        return True
    try:
        return float(value) == float(raw)
    except (TypeError, ValueError):
        return False


def _holds(data: Any, path: list[str]) -> bool:  # noqa: ANN401 - parsed TOML or overrides
    """Whether the nested mapping ``data`` has a value at ``path``."""
    for key in path:
        if not isinstance(data, Mapping) or key not in data:
            return False
        data = data[key]
    return bool(path)


def _setting_error(error: Any, given: Mapping[str, Any]) -> str:  # noqa: ANN401 - a pydantic error
    """One pydantic error as the setting it is about, where it was set and what is wrong with it."""
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    shown = f", got {value!r}" if isinstance(value, str | int | float) and len(repr(value)) <= 80 else ""
    if str(error["type"]) == "value_error":
        shown = ""  # our own checks name what they found
    loc = tuple(error["loc"])
    if str(error["type"]) == "value_error" and message.startswith(PREFIX):
        return f"invalid setting {message}"  # a check across a section's settings names the one
    if str(error["type"]) == "extra_forbidden" and (owner := _other_store(loc)) is not None:
        return (
            f"{env_name(loc)} is a setting of the {owner} store, not of the {loc[1]} store "
            f"(STREAMREC_STORE__TYPE): remove it, or set STREAMREC_STORE__TYPE={owner}"
        )
    unknown = _unknown_name(loc) if str(error["type"]) == "extra_forbidden" else None
    if unknown is not None:
        return (
            f"{unknown} names no setting ({_origin(loc, given)}): check the spelling (a section and its "
            "setting are joined by __; docs/reference/configuration.md lists them)"
        )
    if str(error["type"]) == "union_tag_invalid" and loc == ("store",):  # its type, named by its setting
        context = error.get("ctx", {})
        loc, shown = (*loc, "type"), ""
        message = f"{context.get('tag')!r} is no feature store: one of {context.get('expected_tags')}"
    return f"invalid setting {env_name(loc)} ({_origin(loc, given)}): {message}{shown}"


def _other_store(loc: tuple[int | str, ...]) -> str | None:
    """The other store type whose setting ``loc`` (a key the chosen store does not have) is, or None.

    Examples:
        >>> _other_store(("store", "memory", "url")), _other_store(("store", "redis", "urll"))
        ('redis', None)
    """
    if len(loc) != 3 or loc[0] != "store":
        return None
    types = {str(tag): model for tag, model in STORE_TYPES.items() if tag != loc[1]}
    return next((tag for tag, model in types.items() if loc[2] in model.model_fields), None)


def _unknown_name(loc: tuple[int | str, ...]) -> str | None:
    """The variable an unknown key of a section (or of the top level) would be, else ``None``.

    Examples:
        >>> _unknown_name(("consumer", "batchsize")), _unknown_name(("model", "tables", 0, "rowz"))
        ('STREAMREC_CONSUMER__BATCHSIZE', None)
    """
    parts, end = _setting_parts(loc)
    if end != len(parts) - 1 or not all(isinstance(part, str) for part in parts):
        return None
    fields = fields_of(StreamrecConfig)
    for part in parts[:end]:  # each a section, or the key is inside a setting
        if not is_section(fields.get(str(part))):
            return None
        fields = fields_of(fields[str(part)])
    return PREFIX + "__".join(str(part).upper() for part in parts)


def _source_error(exc: SettingsError) -> ConfigError:
    """A settings value that could not be read, as one clear line.

    A value pydantic-settings could not read (JSON in an env var) as one line naming the
    variable and the position.
    """
    cause = exc.__cause__
    if isinstance(cause, json.JSONDecodeError):
        names = [k for k, v in os.environ.items() if k.upper().startswith("STREAMREC_") and v == cause.doc]
        where = " or ".join(names) or "a STREAMREC_* variable"
        return ConfigError(
            f"{where} is not valid JSON: {cause.msg} at line {cause.lineno} column {cause.colno} "
            f"(char {cause.pos}): fix its value"
        )
    return ConfigError(f"invalid configuration: {exc}")
