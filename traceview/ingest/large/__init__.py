"""Bounded-memory ingest of one large trace: read in chunks of whole steps, normalized chunk
by chunk, analysed beside it in a worker process (``worker``)."""
