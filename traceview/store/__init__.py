"""Persistence only: the run directory's layout, atomic writes and reading tables back (``rundir``),
and where outputs go (``outputs``); it imports no stage (a run as commands read it: ``runs``)."""
