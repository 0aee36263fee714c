"""Metrics, failure attribution and reports, computed from stored data."""
