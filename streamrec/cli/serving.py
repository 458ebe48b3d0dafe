"""``streamrec score`` and ``streamrec serve``: the promoted version, from the command line and
over HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from streamrec.cli.common import build_config, cli_errors, console
from streamrec.cli.options import ConfigFile, LogLevel, json_output, setting

if TYPE_CHECKING:  # pydantic: imported when a command runs, not for --help
    from collections.abc import Sequence

    from streamrec.serving.features import Candidate, GivenHistory

StoreOption = typer.Option(
    True, "--store/--no-store", help="Read users' sequences from the feature store (else every user is new)"
)


def score(
    user: str = typer.Option(..., "--user", help="The user to score for"),
    items: str = typer.Option(
        ..., "--items",
        help='Comma-separated ITEM or ITEM:CATEGORY, or a JSON list as POST /score\'s "items" '
        '(objects carry a candidate\'s behaviour features: [{"item_id": "i1", "genres": ["Drama"]}])',
    ),
    context: str = typer.Option(
        "{}", "--context", help='The declared context features, a JSON object: {"device": "ios"}'
    ),
    history: str | None = typer.Option(
        None, "--history",
        help='The user\'s behaviours, oldest first, a JSON list as POST /score\'s "history", read instead '
        'of the feature store\'s (objects carry their behaviour features: [["i9", "c7"], {"item_id": "i4", '
        '"category_id": "c2", "genres": ["Comedy"]}])',
        show_default="the feature store's",
    ),
    user_features: str | None = typer.Option(
        None, "--user-features",
        help='With --history: the user\'s declared user features, a JSON object as POST /score\'s '
        '"user_features": {"tier": "premium"}',
        show_default="the profile store's",
    ),
    snapshot_dir: Path | None = setting("learner.snapshot_dir"),
    store: bool = StoreOption,
    redis_url: str | None = setting("store.url"),
    engine: str | None = setting("serving.engine"),
    as_json: bool = json_output(),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Score items for a user with the promoted version; unknown users and items read the
    default rows.
    """
    import orjson

    from streamrec.errors import ConfigError
    from streamrec.serving.features import history_source
    from streamrec.serving.scorer import Scorer

    with cli_errors():
        cfg = build_config(
            quiet=True,
            log_level=log_level,
            config_file=config_file,
            learner={"snapshot_dir": snapshot_dir},
            serving={"engine": engine},
            store={"url": redis_url},
        )
        user = _request("--user", orjson.dumps({"user": user, "items": ["-"]}))[0]
        candidates = _candidates(items)
        scorer = Scorer(cfg.learner.snapshot_dir, cfg.serving.threads, engine=cfg.serving.engine)
        given = _object("--context", context)
        users = None if user_features is None else _object("--user-features", user_features)
        if users is not None and history is None:
            raise ConfigError(
                "--user-features go with --history (--history '[]' for a user with none): without it "
                "the profile store gives them"
            )
        behaviours = history_source(cfg, store)(user) if history is None else _history(history, users)
        scores = scorer.model.score(user, behaviours, candidates, given)
        if as_json:
            # a list in candidate order, as POST /score answers: ids may repeat, or differ by category
            doc = {"version": scorer.version, "user": user, "history": len(behaviours),
                   "scores": [float(s) for s in scores]}
            print(orjson.dumps(doc).decode())
            return
        console.print(f"version v{scorer.version:06d}, user {user} with {len(behaviours)} behaviours")
        for candidate, value in sorted(zip(candidates, scores, strict=True), key=lambda x: -x[1]):
            console.print(f"  {candidate.item_id}\t{value:.6f}", highlight=False)


def _candidates(text: str) -> list[Candidate]:
    """``--items``: comma-separated ``ITEM[:CATEGORY]``, or a JSON list as ``POST /score``'s.

    Either form is read as ``POST /score`` reads its ``items``, so its ids meet the same rules;
    a JSON object (one item without the list) is refused as there, not split at its commas.
    """
    import orjson

    if text.lstrip().startswith(("[", "{")):
        body = b'{"user": "-", "items": ' + text.encode() + b"}"
    else:
        body = orjson.dumps({"user": "-", "items": text.split(",") if text.strip() else []})
    return list(_request("--items", body)[1])


def _history(text: str, user_features: dict[str, object] | None = None) -> GivenHistory:
    """``--history``: a JSON list as ``POST /score``'s ``history``, with the ``--user-features`` given."""
    import orjson

    from streamrec.errors import ConfigError

    body = b'{"user": "-", "items": ["-"], "user_features": ' + orjson.dumps(user_features)
    history = _request("--history", body + b', "history": ' + text.encode() + b"}")[2]
    if history is None:
        raise ConfigError("--history must be a JSON list of behaviours, oldest first")
    return history


def _request(flag: str, body: bytes) -> tuple[str, Sequence[Candidate], GivenHistory | None]:
    """A ``POST /score`` body built around one option's value, parsed; a bad one names the option."""
    from streamrec.errors import ConfigError
    from streamrec.serving.http import BadRequest, parse_request

    try:
        return parse_request(body, 2**31)
    except BadRequest as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def _object(flag: str, text: str) -> dict[str, object]:
    """``--context`` or ``--user-features``: a JSON object of feature names and values."""
    import orjson

    from streamrec.errors import ConfigError

    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{flag} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{flag} must be a JSON object of feature names and values")
    return doc


def serve(
    host: str | None = setting("serving.host"),
    port: int | None = setting("serving.port"),
    processes: int | None = setting("serving.processes"),
    engine: str | None = setting("serving.engine"),
    snapshot_dir: Path | None = setting("learner.snapshot_dir"),
    store: bool = StoreOption,
    redis_url: str | None = setting("store.url"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Serve the promoted version over HTTP: POST /score, GET /readyz (also /healthz), GET
    /livez, GET /metrics. It follows `streamrec snapshot promote|rollback` without dropping a
    request.
    """
    from streamrec.serving import processes as workers
    from streamrec.serving.scorer import Scorer

    with cli_errors():
        cfg = build_config(
            log_level=log_level,
            config_file=config_file,
            learner={"snapshot_dir": snapshot_dir},
            serving={"host": host, "port": port, "processes": processes, "engine": engine},
            store={"url": redis_url},
        )
        serving = cfg.serving  # a bad start is refused here, before any worker starts
        scorer = Scorer(cfg.learner.snapshot_dir, serving.threads, serving.batch_candidates, serving.engine)
        sock = workers.listen(serving.host, serving.port)  # a port in use: one line, before "serving"
        instead = "" if scorer.serves_current else " (not the version serving/CURRENT names: see the warning)"
        many = f" on {serving.processes} processes" if serving.processes > 1 else ""
        console.print(  # said once the port is bound: a connection waits for the server from here
            f"serving v{scorer.version:06d}{instead} with {scorer.model.engine} from "
            f"{cfg.learner.snapshot_dir} on http://{serving.host}:{sock.getsockname()[1]}{many}"
        )
        if serving.processes > 1:
            del scorer  # each worker loads its own
            workers.run(cfg, store, sock)
            return
        workers.run_one(workers.serving_app(cfg, scorer, store), sock, serving)
