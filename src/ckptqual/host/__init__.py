"""The host and the target: the guard and its lock, the run's space on it, page cache, GPU probe."""
