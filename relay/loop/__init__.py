"""The relay loop: `relay` (run / run_once), `claimer` (claims, probes, rate tokens), `settler`
(writes outcomes), `maintenance` (leases, retention), `circuits` (the shared circuits and rate
limits), `observer` (spans and metrics); `wiring` puts the usual parts together.

It sees its database and broker only through relay.ports, so it runs on fakes.
"""
