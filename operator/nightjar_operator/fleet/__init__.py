"""The fleet loop's pure logic: scrape parsing, aggregation, priors, SLO and the rollout state machine.

No I/O here; the kopf handlers in ``nightjar_operator.handlers.fleet_tick`` / ``.rollout`` drive it.
"""
