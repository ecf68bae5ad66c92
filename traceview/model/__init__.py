"""The data model every stage shares: the Arrow tables (``schema``), the typed results the
analysis hands to the views (``results``), the run's manifest, the errors and notes, column
helpers (``columns``) and the escaping of untrusted text (``escape``). It imports no stage."""
