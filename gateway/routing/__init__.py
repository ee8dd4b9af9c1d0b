"""Routing policies: which Triton endpoint serves a request (one file each, registry.py names them)."""
