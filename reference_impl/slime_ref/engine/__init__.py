"""The built-in engine: an HTTP server that speaks SGLang's protocol, for CPU machines and tests.

Run it as ``python -m slime_ref.engine --model-path DIR --host 127.0.0.1 --port P``. It serves the
routes slime's trainer and sglang-router use (``/generate`` with log-probs, health and info, pause,
flush, abort, memory release, and the three weight-update families) with SGLang 0.5.15.post1's
field names, on an HF checkpoint, in float32 by default. On a GPU machine the same client talks to
real SGLang instead (``slime_ref.rollout.servers``). For rehearsals on a random model, a script
(``SLIME_REF_ENGINE_SCRIPT``, :mod:`slime_ref.engine.script`) answers chosen prompts with given
text, teacher-forced through the model.
"""
