"""Task quality gates: a task must not reward a wrong fix, give its answer away, or yield to a trivial strategy.

Three audits (``weak_tests``, ``leaks``, ``shortcuts``) look at one task each and ``gate`` turns what they
found into one ``QualityRecord`` per task and a keep/drop decision. Their shared vocabulary:

- the record types live in ``tasks/quality_record.py`` (the task schema carries a ``QualityRecord``);
- ``change.Change``: what a patch does to the base tree, file by file and line by line (added lines, touched
  lines, hunks that can be applied one at a time);
- ``probe.Probe``: grading a rewrite of the base tree with the real verifier, counting verifier runs.
"""
