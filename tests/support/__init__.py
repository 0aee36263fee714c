"""What the tests share: session fixtures (plugins that tests/conftest.py registers), servers and stand-ins,
and helpers several test modules use. The test modules themselves are tests/test_*.py."""
