"""slime compatibility module (slime), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md; the names slime's v0.3.1 examples import, and
what becomes of each here, in slime_rehearse/compat/examples_v0.3.1.json."""

from slime_rehearse.compat import layouts
from slime_rehearse.compat._exports import exports
from slime_rehearse.compat._missing import install_finder

SLIME_CHECK_COMPAT = True  # this `slime` is the compatibility layer, not slime

# a slime.* module no compat file provides raises the layer's ImportError (with its reason), not
# Python's bare "No module named ..."
install_finder()
# the modules whose name differs between slime v0.3.1 and main (slime.utils.trace_utils against
# slime.observability.trace_utils ...) are served under the target slime's name only
# (SLIME_CHECK_SLIME_TARGET; both without it), and the other name's ImportError says where it went
layouts.install_finder()

__all__, __getattr__ = exports(__name__)
