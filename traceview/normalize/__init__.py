"""Normalize one rank's parsed trace into the events table: classify each event by the rules
(``rules``), lay out MXNet's engine threads (``mxnet_engine``), infer steps where the trace has
no markers (``step_inference``), then the passes of ``pipeline``: call trees, steps, phases,
device activities linked to their launching calls, collectives named."""
