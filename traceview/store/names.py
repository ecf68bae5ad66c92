"""The names of a run directory's parts (docs/reference/run-directory.md), apart from the code
that reads and writes them (store/rundir.py) so that what only looks at a run (`traceview watch`)
imports nothing heavy."""

MANIFEST = "manifest.json"
EVENTS = "events"
RAW = "raw"
#: RUN/windows/K: the profile windows asked of a running job (each a run directory of its
#: own); RUN/requests: the asks (``traceview profile``); RUN/live.json: the job collect runs
WINDOWS, REQUESTS, LIVE = "windows", "requests", "live.json"
