from traceview.cli import run

run()
