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
