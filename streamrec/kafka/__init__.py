"""Kafka plumbing: clients, topics, record positions, event-time alignment, the record source."""
