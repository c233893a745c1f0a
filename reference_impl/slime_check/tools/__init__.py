"""Maintenance tools for slime-check (not used at run time)."""
