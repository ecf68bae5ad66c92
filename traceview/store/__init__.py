"""The run directory, the boundary between the stages (``rundir``: its layout, atomic writes,
reading tables back), and a run as the commands read it, ingested and analysed
(``analysed``: ``open_run``, ``ingest_run``, the cached tables recomputed when stale)."""
