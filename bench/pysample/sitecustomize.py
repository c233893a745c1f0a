"""A sampling profiler of every Python process started with this folder first on PYTHONPATH.

``engine_throughput.py --host-profile`` puts it there for the SGLang server it starts, with
``SLIME_BENCH_PYSAMPLE_DIR`` set: while the file ``on`` exists in that folder, a daemon thread of
each process records the Python stack of every thread every 2 ms (and holds ``<pid>.active``);
when ``on`` goes away it writes ``<pid>.folded`` there (one ``thread;frame;frame... count`` line
per distinct stack, flamegraph input), removes ``<pid>.active`` and stops. It needs no ptrace
rights, which a container often withholds from py-spy. A sample can only be taken when the sampled
thread releases the GIL, so time inside one long C call is counted at its end: read the shares as
"where the host's Python time goes", not as exact times.
"""

import collections
import os
import sys
import threading
import time

_DIR = os.environ.get("SLIME_BENCH_PYSAMPLE_DIR")


def _stack(frame, limit=80):
    names = []
    while frame is not None and len(names) < limit:
        code = frame.f_code
        names.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
        frame = frame.f_back
    return ";".join(reversed(names))


def _sample_while_on():
    on = os.path.join(_DIR, "on")
    me = threading.get_ident()
    counts = collections.Counter()
    while not os.path.exists(on):
        time.sleep(0.05)
    active = os.path.join(_DIR, f"{os.getpid()}.active")  # "sampling, file to come" for the reader
    open(active, "w").close()
    while os.path.exists(on):
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident != me:
                counts[f"{names.get(ident, ident)};{_stack(frame)}"] += 1
        time.sleep(0.002)
    tmp = os.path.join(_DIR, f".{os.getpid()}.folded")
    with open(tmp, "w") as f:
        f.writelines(f"{stack} {n}\n" for stack, n in counts.most_common())
    os.replace(tmp, os.path.join(_DIR, f"{os.getpid()}.folded"))
    os.unlink(active)


if _DIR:
    threading.Thread(target=_sample_while_on, name="pysample", daemon=True).start()
