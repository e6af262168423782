"""The run record and every view of it."""
