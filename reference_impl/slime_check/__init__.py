"""slime-check: catch a broken slime job before it burns GPU hours.

It reads, probes and reports; it never changes the machine.
"""

__version__ = "0.1.0"
