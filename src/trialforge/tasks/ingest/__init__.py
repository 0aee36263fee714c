"""Ingestion adapters: one module per source, each turning raw records into Tasks plus a Funnel.

The adapters (``github``, ``github_rest``, ``jira``, ``swebench``, ``gitlog``; ``sources`` picks one per
params.yaml entry) share what every source needs: ``records`` (export files read into records with their
lines), ``git`` (mirrors and git commands), ``objects`` (reading trees and commits), ``trees`` (a commit's tree
as a base snapshot), ``fixes`` (a fix split into code and test patches, refused when it cannot grade),
``caps`` (size caps on a record) and ``extras`` (facts a task has no field for). Every refusal is a
``RepoError`` or ``PatchError`` whose ``reason`` is the funnel key: one record dropped, the rest kept.
"""
