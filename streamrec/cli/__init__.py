"""The ``streamrec`` command: one group, one module per subcommand group.

Each module imports what its commands need (Paddle, the Kafka and Redis clients, pydantic) in
the commands' bodies, so that ``--help`` stays fast.
"""

from __future__ import annotations

from streamrec.cli import consumers, learner, replay, services, snapshot, traffic
from streamrec.cli.common import command_group
from streamrec.cli.demo import demo
from streamrec.cli.generate import generate
from streamrec.cli.produce import produce
from streamrec.cli.serving import score, serve
from streamrec.paddlesignals import before_paddle

app = command_group(
    "streamrec: real-time incremental recommendation learning on Kafka, Redis and Paddle.",
    pretty_exceptions_enable=False,
)


app.command("produce")(produce)
app.command("demo")(demo)
app.command("generate")(generate)
app.command("score")(score)
app.command("serve")(serve)
app.add_typer(consumers.app, name="consumers")
app.add_typer(learner.app, name="learner")
traffic.register(snapshot.app)
app.add_typer(snapshot.app, name="snapshot")
app.add_typer(replay.app, name="replay")
services.register(app)


def main() -> None:
    """Console-script entry point."""
    before_paddle()  # Paddle's SIGTERM handler would abort a command, or hang it
    app()
