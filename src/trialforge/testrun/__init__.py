"""Run tests in a sandbox and read per-test outcomes the code under test cannot forge unseen.

``prepare`` (on the host, before the sandbox exists) rewrites the tree's test files: in a graded run
the expected values of the assertions the host can judge leave the sandbox (``blinding.blind``: the
sandbox only observes, the host compares), and in a validation run every such assertion is observed
as it runs (``blinding.instrument``, to calibrate); then it plants canary tests (``canaries``) and hashes
the pristine test files. ``run.run_tests`` runs the task's runner (pytest or unittest, from its
``EnvSpec.test_cmd``, with the options ``command`` lets through and the ``EnvSpec.env`` it allows)
under the recorder (``recorder_program.py``), naming the tests to run in its key file, never on its
command line; ``report.read_report`` checks what came back. docs/verification.md has the threat model.
Validation, synthesis and grading all run tests through here: one protection for every verdict,
whichever runner a repository uses.
"""
