"""Placeholder package; the exact_cache policy arrives with its issue."""
