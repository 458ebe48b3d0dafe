"""Per-arm request counters: both outcomes counted from an arm's first request."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from streamrec.serving.routing import ArmMetrics


def test_an_arms_error_series_is_at_zero_from_its_first_answer() -> None:
    """Noted by a tour: ``streamrec_serving_arm_requests_total{outcome="error"}`` had no series
    until an arm's first failure, so the documented ``rate(...{outcome="error"}[5m]) > 0``
    alert could not see that failure (a rate needs the series before it).
    """
    registry = CollectorRegistry()
    arms = ArmMetrics(registry)
    arms.observe("canary", 2, 0.004, [0.5])

    def count(outcome: str) -> float | None:
        labels = {"arm": "canary", "version": "v000002", "outcome": outcome}
        return registry.get_sample_value("streamrec_serving_arm_requests_total", labels)

    assert (count("ok"), count("error")) == (1.0, 0.0)
    arms.observe("canary", 2, 0.004, None)
    assert (count("ok"), count("error")) == (1.0, 1.0)


def test_the_series_of_versions_no_longer_answering_are_dropped() -> None:
    """Found by the soak tour: each version served added 27 series to ``serve``'s /metrics (its
    requests, latency buckets and scores, by version) and none went, 156 to 534 series in eight
    minutes of a version every 30 s: without bound for a server that follows its learner. An
    arm keeps its newest `KEPT_VERSIONS` versions' series; a straggler of an older one counts.
    """
    registry = CollectorRegistry()
    arms = ArmMetrics(registry)

    def versions() -> set[str]:
        return {
            sample.labels["version"]
            for family in registry.collect()
            for sample in family.samples
            if "version" in sample.labels
        }

    for version in range(1, 51):
        arms.observe("served", version, 0.004, [0.5])
        arms.observe("canary", 1000 + version % 2, 0.004, [0.5])
    assert versions() == {"v000048", "v000049", "v000050", "v001000", "v001001"}
    arms.observe("served", 49, 0.004, None)  # a request answered by the version before, as it finished
    errors = {"arm": "served", "version": "v000049", "outcome": "error"}
    assert registry.get_sample_value("streamrec_serving_arm_requests_total", errors) == 1.0
