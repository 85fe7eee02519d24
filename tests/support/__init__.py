"""What the test tiers share, one module per concern: waiting on a condition, the databases and
the migrated schema each test's is cloned from, the broker, in-process relays, the CLI as a
subprocess, a TCP proxy that fails on demand, and TLS. tests/conftest.py registers the fixtures
these modules define."""
