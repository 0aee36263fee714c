"""A repository's environment spec, read from its own files, then its per-repository overrides.

Nothing in the repository is executed here: a ``setup.py`` that computes its arguments runs in a sandbox when the
caller passes ``resolve_env`` an evaluator (``tasks.setupeval``). ``readers`` finds what its files declare,
``decide`` turns that into an ``EnvSpec`` (the Python, the requirements, the test command), and ``resolve`` lays the
overrides over it (``resolve_env``: the entry callers use), also for a tree at a given commit, cached.
"""
