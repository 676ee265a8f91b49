"""Pointsman's local stack: the processes `make run` starts and the integration tests drive."""
