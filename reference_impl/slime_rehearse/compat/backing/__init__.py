"""Modules the compatibility namespace serves under a slime name that depends on the target slime
(``slime_rehearse.compat.layouts.MODULES``): one implementation, two names."""
