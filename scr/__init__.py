"""Placeholder package; the scr policy arrives with its issue."""
