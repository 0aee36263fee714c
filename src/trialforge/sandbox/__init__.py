"""Sandboxes: one protocol (``base``), two backends (``bwrap/``, ``container/``), the pool above them, and what
the host keeps and ``trialforge reap`` removes (``host/``). The modules at this level serve both backends: the
disk budget and bounded host copies, seccomp, /proc masks, images and timed host processes."""
