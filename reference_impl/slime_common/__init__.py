"""What slime-check and slime-ref share: error types and the CLI runner, atomic writes, process groups
started and stopped by id (``process_tree``), and slime v0.3.1's flag registry.

Both packages import it; it imports neither, and nothing heavy (no Ray, no torch), so
``slime-check prereqs`` stays fast and importing it has no side effects.
"""
