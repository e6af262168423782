"""Configuration: the table of settings, drive and workload files, the resolved run settings."""
