"""The container-engine backend (Docker Engine API: Docker or Podman): ``backend`` (the sandboxes),
``transfer`` (bytes in and out), ``confinement``, the engines it talks to (``engine``, ``endpoints``), several
at once (``fleet``) and the registry between them (``registry``)."""
