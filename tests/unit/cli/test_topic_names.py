"""A topic name Kafka refuses is one line before any broker is asked.

``streamrec produce FILE --topic "bad topic"`` (or ``--topic ""``) published to it on the local
broker, which takes any name; a Kafka cluster refuses a name outside [a-zA-Z0-9._-] or over 249
characters at the first send, after the file was read. Found by the replay tour.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import KafkaConfig


@pytest.mark.parametrize("name", ["bad topic", "", ".", "..", "a/b", "t" * 250, "événements"])
@pytest.mark.parametrize("field", ["events_topic", "dlq_topic", "samples_topic", "samples_dlq_topic"])
def test_a_name_kafka_refuses_is_refused(field: str, name: str) -> None:
    with pytest.raises(ValidationError, match="Kafka topic name"):
        KafkaConfig(**{field: name})


@pytest.mark.parametrize("name", ["streamrec.events", "my_app-events.v2", "t" * 249])
def test_names_kafka_takes_are_taken(name: str) -> None:
    assert KafkaConfig(events_topic=name).events_topic == name


@pytest.mark.parametrize("command", [["produce", "--topic"], ["replay", "publish", "--events-topic"]])
def test_the_flag_is_one_line_naming_the_setting(command: list[str]) -> None:
    *verb, flag = command
    out = CliRunner().invoke(app, [*verb, "synthetic:events=5", flag, "bad topic",
                                   "--bootstrap-servers", "127.0.0.1:1"])
    assert out.exit_code == 1, out.output
    said = " ".join(out.output.split())
    assert said.startswith("error: invalid setting STREAMREC_KAFKA__EVENTS_TOPIC"), said
    assert "Kafka topic name" in said and "published" not in said
