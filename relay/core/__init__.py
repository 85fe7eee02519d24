"""The pure core of the relay: failure classes, backoff and retry decisions.

Nothing here imports a database or broker driver, reads the clock or draws randomness of its own:
`now` and `rng` are arguments, so every decision is a table test.
"""
