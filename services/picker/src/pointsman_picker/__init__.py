"""Pointsman's picker: an Envoy ext_proc server that picks a model-server pod for each request."""
