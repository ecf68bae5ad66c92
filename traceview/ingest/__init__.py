"""Ingest: from trace files to a run directory. ``run`` finds the traces and assigns ranks,
reads each rank (``traceview.parsers``, then ``traceview.normalize``) on this machine, in a
pool of processes or on a Dask cluster (``cluster``), and writes the events and the manifest;
``large`` reads a trace too large for memory in chunks of whole steps."""
