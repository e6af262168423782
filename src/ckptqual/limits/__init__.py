"""Limits and verdicts: units, declared limits, judgements, the SNIA steady state, the run's verdict."""
