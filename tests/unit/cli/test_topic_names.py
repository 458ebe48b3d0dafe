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
from streamrec.config import ConsumerConfig, KafkaConfig, LearnerConfig


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


# Found by the replay tour (test first): `learner run --group-id ""` (and an empty
# STREAMREC_CONSUMER__GROUP_ID) aborted the process in confluent_kafka's C code (exit 134, a Paddle
# FatalError trace); the samples' dead-letter topic set to the samples topic dead-lettered a bad
# sample into the topic the learner reads, again and again (one bad record: 11 copies in 40 s,
# --stop-when-idle never reached).
@pytest.mark.parametrize("group", ["", "  "])
@pytest.mark.parametrize(("section", "flag"), [
    (LearnerConfig, "STREAMREC_LEARNER__GROUP_ID"), (ConsumerConfig, "STREAMREC_CONSUMER__GROUP_ID"),
])
def test_an_empty_group_id_is_refused(section: type, flag: str, group: str) -> None:
    with pytest.raises(ValidationError, match="group id"):
        section(group_id=group)


@pytest.mark.parametrize("command", [["learner", "run"], ["consumers", "run"]])
def test_an_empty_group_id_flag_is_one_line(command: list[str]) -> None:
    section = command[0].rstrip("s").upper()
    out = CliRunner().invoke(app, [*command, "--bootstrap-servers", "127.0.0.1:1"],
                             env={f"STREAMREC_{section}__GROUP_ID": ""})
    said = " ".join(out.output.split())
    assert out.exit_code == 1, said
    assert said.startswith(f"error: invalid setting STREAMREC_{section}__GROUP_ID"), said


@pytest.mark.parametrize(("fields", "names"), [
    ({"samples_dlq_topic": "streamrec.samples"}, "SAMPLES_DLQ_TOPIC and STREAMREC_KAFKA__SAMPLES_TOPIC"),
    ({"dlq_topic": "streamrec.events"}, "DLQ_TOPIC and STREAMREC_KAFKA__EVENTS_TOPIC"),
    ({"samples_topic": "streamrec.events"}, "SAMPLES_TOPIC and STREAMREC_KAFKA__EVENTS_TOPIC"),
    ({"samples_dlq_topic": "x", "events_topic": "x"}, "SAMPLES_DLQ_TOPIC and STREAMREC_KAFKA__EVENTS_TOPIC"),
])
def test_a_topic_read_may_not_be_written_as_another(fields: dict[str, str], names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        KafkaConfig(**fields)


def test_the_two_dead_letter_topics_may_be_one() -> None:
    assert KafkaConfig(dlq_topic="dead", samples_dlq_topic="dead").dlq_topic == "dead"
