"""``streamrec generate OUT``: write a seeded synthetic click stream (or feed log) as JSONL events."""

from __future__ import annotations

from pathlib import Path

import typer

from streamrec.cli.common import cli_errors, console
from streamrec.cli.options import path_given
from streamrec.errors import ConfigError, DatasetError, FieldError
from streamrec.wording import plural

# ClickStreamSpec's defaults (streamrec.datasets.synthetic imports numpy, so --help does not
# read them there; tests/unit/cli/test_options.py checks they are the same).
DEFAULTS = {"events": 20_000, "users": 500, "items": 5_000, "categories": 50, "seed": 0}


def generate(
    out: Path = typer.Argument(
        ..., help="JSONL file to write (the event contract, one per line)", show_default=False,
        metavar="OUT", parser=path_given,
    ),
    events: int = typer.Option(
        DEFAULTS["events"],
        help="Events to generate (with --feed: behaviours, each shown on a page of impressions)",
    ),
    users: int = typer.Option(DEFAULTS["users"], help="Users"),
    items: int = typer.Option(DEFAULTS["items"], help="Items in the catalogue by the end"),
    categories: int = typer.Option(DEFAULTS["categories"], help="Item categories"),
    seed: int = typer.Option(DEFAULTS["seed"], help="Random seed: the same seed, the same stream"),
    device_effect: float = typer.Option(
        0.0, help="Give each session a device (ios, android, web; the field device) and redraw this "
        "share of events' categories from their device's: a context feature with a known effect",
        show_default="0: no device field",
    ),
    feed: bool = typer.Option(
        False, "--feed", help="A feed log for STREAMREC_CONSUMER__LABELS=join: pages of impressions, "
        "each pv a click on one shown item (about 8 events per behaviour)",
    ),
) -> None:
    """Generate implicit clicks (pv/cart/fav/buy, heavy-tailed popularity, new items arriving)
    and write them in event-time order; `streamrec produce OUT` publishes them.
    """
    from streamrec.datasets.declared import wire
    from streamrec.datasets.feed import FeedSpec, generate_feed
    from streamrec.datasets.synthetic import ClickStreamSpec, generate_rows

    with cli_errors():
        try:
            spec = ClickStreamSpec(
                users=users, items=items, categories=categories, events=events, seed=seed,
                device_effect=device_effect,
            )
        except FieldError as exc:  # named by the flag given, not by the spec's field
            raise ConfigError(exc.naming(lambda field: "--" + field.replace("_", "-"))) from exc
        if feed:
            log = generate_feed(FeedSpec(clicks=spec, seed=seed))
            stream = [(e, log.fields.get(e.event_id, {})) for e in log.events]
        else:
            stream = generate_rows(spec)
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            tmp.write_bytes(b"".join(wire(e, fields) + b"\n" for e, fields in stream))
            tmp.replace(out)  # whole or not at all
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DatasetError(f"cannot write {out}: {exc.strerror}") from exc
        console.print(f"wrote {plural(len(stream), 'event')} to {out}")
