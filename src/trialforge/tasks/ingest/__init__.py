"""Ingestion adapters: one module per source, each turning raw records into Tasks plus a Funnel."""
