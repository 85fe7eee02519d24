"""The pure core of the relay: outcomes and failure classes, backoff and retry decisions,
settlement, circuit breakers and rate-limit buckets, resource names, the retention policy.

Nothing here imports a database or broker driver, reads the clock or draws randomness of its own:
`now` and `rng` are arguments, so every decision is a table test.
"""
