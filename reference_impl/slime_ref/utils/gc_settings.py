"""Python's cyclic garbage collector in the process that reads the engines' answers.

A rollout round's answers are about 800k short-lived Python objects: 512 samples x 512 tokens, each
token's log-prob an SGLang ``[logprob, token_id, null]`` list. With the collector's defaults the
process runs 2-3 full collections during the round, and each walks every object the process holds,
the hundreds of thousands its imports and set-up made (Ray, transformers, the data) included. On 2
CPU cores that was 0.33 s of the 0.43 s a round's answers took to read (``bench/rollout_http.py
--rollout-imports``, 8 prompts a request), on the rollout's critical path: the answers come back at
the round's end.

Two settings take it out, once the set-up is done:
- ``gc.freeze()``: what the process holds by then is never walked again (SGLang's ``/freeze_gc``
  does the same in its own processes);
- full collections a tenth as often (``gc.set_threshold``'s third value, 10 -> 100).

Garbage is still freed. Reference counting frees every object, frozen or not, when its last reference
goes, and reference cycles among objects made later are still collected, by the young generations'
collections and by the full ones. Only a cycle among the frozen objects themselves would stay; those
are the set-up's, which live for the whole run.
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
