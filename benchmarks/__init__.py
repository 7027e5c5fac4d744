"""Tooling around the server: the demo, benchmarks, replays, arrival traces, baselines,
the shipped data set and the embedded Kafka broker. The server never imports it."""
