"""The Envoy ext_proc side: body handling, response builders, the per-stream state machine, the servicer."""
