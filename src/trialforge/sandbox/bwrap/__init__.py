"""The bubblewrap backend: ``backend`` (the sandboxes), and how each is confined (``confinement``, ``cgroups``,
``mounts``, ``nsholder`` for normal users, ``usernet`` for opt-in egress)."""
