"""``driftline bench configurator``'s parts: the ground truth every method faces, the
baselines, and the runs (:mod:`benchmarks.bench.configurator` reports them)."""
