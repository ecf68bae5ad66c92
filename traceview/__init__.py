"""traceview: where each training step's time goes, on every rank."""

__version__ = "0.1.0"
