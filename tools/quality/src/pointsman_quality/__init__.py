"""Pointsman's routing-quality benchmark."""
