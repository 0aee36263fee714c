"""Tasks: the record, ingestion adapters, synthesis, validation, snapshots and task sets."""
