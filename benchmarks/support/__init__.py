"""Modules the benchmarks share (not benchmarks themselves: `make bench` runs ``benchmarks/*.py`` only).

Importable as ``support.NAME`` from a benchmark (run as a script, its folder is on ``sys.path``) and from the tests
(``pythonpath`` in pyproject.toml holds ``benchmarks``).
"""
