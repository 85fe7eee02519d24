"""What the test tiers share, one module per concern: waiting on a condition, the databases, the
broker, in-process relays, the CLI as a subprocess, a TCP proxy that fails on demand, and TLS.
tests/conftest.py registers the fixtures these modules define."""
