"""Plans: architecture and parallelism to the exact files and tensors of a checkpoint; plan files; strategies."""
