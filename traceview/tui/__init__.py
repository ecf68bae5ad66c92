"""The terminal UI (`traceview tui`)."""
