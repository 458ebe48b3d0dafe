"""Why a record or a request is not JSON, said in terms of what its sender wrote.

Python's ``json.dumps`` writes ``float("nan")`` and infinities as ``NaN`` and ``Infinity``, which
JSON does not have; orjson's own message names only a column, so the reason names the field.
"""

from __future__ import annotations

import re

import orjson

_TOKENS = ("NaN", "Infinity", "-Infinity")
# the key just before a value: `"name": ` (a value inside a list has none)
_KEY = re.compile(r'"((?:[^"\\]|\\.){1,128})"\s*:\s*$')


def json_error(exc: orjson.JSONDecodeError) -> str:
    """The reason after ``not valid JSON: ``: orjson's, or which field holds a NaN or Infinity.

    Examples:
        >>> try:
        ...     orjson.loads('{"user_id": "u1", "dwell_s": NaN}')
        ... except orjson.JSONDecodeError as exc:
        ...     print(json_error(exc).split(" (")[0])
        field 'dwell_s' holds NaN, which JSON does not have
    """
    doc, pos = exc.doc if isinstance(exc.doc, str) else "", exc.pos
    start = pos - 1 if doc[pos - 1 : pos] == "-" and doc.startswith("Infinity", pos) else pos
    token = next((t for t in _TOKENS if doc.startswith(t, start)), None)
    if token is None:
        return str(exc)
    key = _KEY.search(doc[max(0, start - 300) : start])
    where = f"field {key.group(1)!r} holds" if key else "a value is"
    return (f"{where} {token}, which JSON does not have (send null for none; "
            f"json.dumps(allow_nan=False) finds them): line {exc.lineno} column {exc.colno}")
