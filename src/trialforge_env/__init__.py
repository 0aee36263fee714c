"""verifiers' plugin ``trialforge-env``: verifiers 0.4.0 finds a taskset, its env and its default harness by a
top-level module name, so this package re-exports the adapter (``trialforge.envserver.adapters.verifiers``)."""

from trialforge.envserver.adapters.verifiers import *  # noqa: F403
from trialforge.envserver.adapters.verifiers import __all__ as __all__
