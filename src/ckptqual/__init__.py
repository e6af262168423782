"""ckptqual: qualify storage for AI-training checkpoint workloads with pytest."""

__version__ = "0.1.0"
