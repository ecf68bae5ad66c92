"""Views: they render results (``traceview.model.results``) and compute nothing.

``style`` holds the pieces every view shares (phase colours and letters, numbers, the verdict
sentences); ``text`` is the terminal report; the TUI (``traceview.tui``) is another view over
the same results.
"""
