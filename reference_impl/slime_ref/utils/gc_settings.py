"""Python's cyclic garbage collector in the process that reads the engines' answers.

A rollout round's answers are about 800k short-lived Python objects: 512 samples x 512 tokens, each
token's log-prob an SGLang ``[logprob, token_id, null]`` list. With the collector's defaults the
process runs 2-3 full collections during the round, and each walks every object the process holds,
the hundreds of thousands its imports and set-up made (Ray, transformers, the data) included. On 2
CPU cores that was 0.31 s of a 0.40 s round of reading answers (``bench/rollout_http.py
--rollout-imports``), on the rollout's critical path: the answers come back at the round's end.

Two settings take it out, once the set-up is done:
- ``gc.freeze()``: what the process holds by then is never walked again (SGLang's ``/freeze_gc``
  does the same in its own processes);
- full collections a tenth as often (``gc.set_threshold``'s third value, 10 -> 100).

Nothing is left uncollected for good. Reference counting still frees every object the moment its last
reference goes, and cycles among objects made later are still found, by the young collections at once
and by a full collection every 100 middle-aged ones.
"""

from __future__ import annotations

import gc

FULL_COLLECTION_EVERY = 100  # middle-generation collections between full ones (Python's default: 10)


def freeze_after_setup() -> int:
    """Collect once, freeze what survives, and space out full collections. Call it in a process that
    reads rollouts, after its set-up; returns how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
    return gc.get_freeze_count()
