"""pytest wiring only: options, fixtures and hooks of the ckptqual plugin."""
