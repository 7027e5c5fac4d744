"""Kafka: the embedded broker, the exactly-once consumer, and producers for replays."""
