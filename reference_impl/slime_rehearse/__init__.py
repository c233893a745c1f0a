"""slime-rehearse: the parts of slime-check that run things, above both tools.

The `slime-check` command (cli), `slime-check smoke` (a short rehearsal of the user's own job on
slime-ref, with their hooks), `slime-check quickstart` (a first run on slime-ref) and the `slime`
compatibility namespace those rehearsals import the user's hooks against. It imports slime_check
(which only reads, probes and reports) and slime_ref (which trains); neither imports it.
"""
