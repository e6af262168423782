"""Runs: rank workers, the raw baseline, fill passes, restore, odd layouts, the read sweep, the qualification."""
