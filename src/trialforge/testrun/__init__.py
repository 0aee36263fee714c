"""Run tests in a sandbox and read per-test outcomes the code under test cannot forge unseen.

``prepare`` (on the host, before the sandbox exists) rewrites the tree's test files (``blinding.blind`` for a graded
run, ``blinding.instrument`` for a validation run), plants canaries (``canaries``) and hashes the pristine test
files; ``run.run_tests`` runs the task's runner under the recorder (``recorder_program.py``), naming the tests in its
key file, never on its command line; ``report.read_report`` checks what came back. Validation, synthesis and grading
all run tests through here. Threat model: docs/verification.md.
"""
