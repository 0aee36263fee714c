"""What trialforge keeps on the host, and how ``trialforge reap`` finds it: the state dir (``statedir``), the
sandboxes' accounts (``identity``, ``idleases``), records of live sandboxes and of processes a run started
(``reaper``, ``owned``), and the leftovers of dead runs (``leftovers``)."""
