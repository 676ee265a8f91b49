"""Pointsman's shared core: what the collector and the picker agree on.

Pure code only: no network clients, no clocks, no randomness.
"""
