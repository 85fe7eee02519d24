"""The relay loop: `relay` (run / run_once, and one message's path through the loop, step by
step), `claimer` (claims, probes, rate tokens), `leases` (what the relay holds), `settler` (writes
outcomes), `chains` (hot keys' runs), `suspects` (rows published apart), `maintenance` (leases,
retention), `pulse` (the heartbeat), `circuits` (the shared circuits and rate limits), `observer`
(spans and metrics); `wiring` puts the usual parts together.

It sees its database and broker only through relay.ports, so it runs on fakes.
"""
