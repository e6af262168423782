"""Captured data, not tests: the sysfs trees hold symlink loops, as sysfs does, so pytest must not walk them."""

collect_ignore_glob = ["*"]
