"""The rollout's HTTP share: the seconds our SGLang client and a loopback HTTP server spend moving one
round's requests and answers, with no engine behind the server.

A GPU rollout round (512 prompts x 512 new tokens with log-probs, `engine_throughput.py --engine
sglang --gpu-util`) has the GPU idle for 1.3-2.0 s at its head and tail. Part of that is HTTP and JSON
on the host: the client sending 512 requests, and reading 512 answers of about 22 KB each. This bench
measures that part alone, on any machine, so that the rest can be put on SGLang's own processes.

The server (a child process, like SGLang's HTTP server) holds every request of a round until the last
one has arrived, then writes each answer in SGLang's /generate fields (`output_token_logprobs` as
[logprob, token_id, null]): pre-serialized, so that its own work is as small as it can be, or with
--build-answers built and serialized with orjson for each request, as SGLang's tokenizer manager does
(a lower bound of that process's part: it also detokenizes). The client is the rollout's: one
`SGLangClient` for all rounds, as `sglang_rollout.py` keeps one.

Per round, from the server's clock and the client's (one host):
    head_s     round start -> the last request has reached the server
    answers_s  the first answer written -> the last one written (the server's part)
    tail_s     the last answer written -> the client has parsed every answer
    gc_s       of the round, the client process's seconds in Python's cyclic garbage collector
Each figure is the median over --rounds rounds after one warm-up round. ``parse_s`` times parsing one
round's answer bodies in this process, with the json module and with orjson (what the client uses).

A round's answers are about 800k Python objects, so the collector runs full collections during it, and
each walks every object the process holds. --rollout-imports first imports what the rollout manager's
process holds (Ray, transformers, slime-ref's rollout), and --freeze-gc then applies the rollout
manager's setting after its set-up (``slime_ref.utils.gc_settings``: those objects frozen out of the
collector's walks, full collections a tenth as often).

    python bench/rollout_http.py                              # 512 x 512, one prompt a request
    python bench/rollout_http.py --prompts-per-request 1 8 64 # the batched form too (the GRPO rollout: 8)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference_impl"))
from slime_common.process_tree import start_in_session, stop_groups  # noqa: E402


def answer(prompt_tokens: int, new_tokens: int, seed: int) -> dict:
    """One /generate answer with return_logprob, in SGLang 0.5.15's fields and at its size."""
    ids = [(seed * 7919 + 104729 * i) % 151000 + 2 for i in range(new_tokens)]
    return {"text": " word" * new_tokens, "output_ids": ids,
            "meta_info": {"id": f"{seed:032x}", "finish_reason": {"type": "length", "length": new_tokens},
                          "prompt_tokens": prompt_tokens, "weight_version": "default", "total_retractions": 0,
                          "completion_tokens": new_tokens, "cached_tokens": 0, "e2e_latency": 5.123456789,
                          "input_token_logprobs": [[None, 2, None]],
                          "output_token_logprobs": [[-((seed + i) % 997) / 123.456789, t, None]
                                                    for i, t in enumerate(ids)]}}


def serve(port: int, prompt_tokens: int, new_tokens: int, sizes: list[int], build_answers: bool) -> None:
    """The server: POST /round {"requests": n} starts a round of n /generate requests; GET /round
    returns the last round's times. Bound to loopback; runs until terminated."""
    import orjson
    from aiohttp import web

    bodies = {k: orjson.dumps([answer(prompt_tokens, new_tokens, i) for i in range(k)]) for k in sizes if k > 1}
    bodies[1] = orjson.dumps(answer(prompt_tokens, new_tokens, 1))
    state = {"expected": 0, "arrived": [], "written": [], "all_in": asyncio.Event()}

    async def generate(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        state["arrived"].append(time.time())
        if len(state["arrived"]) == state["expected"]:
            state["all_in"].set()
        await state["all_in"].wait()
        ids = body["input_ids"]
        batched = bool(ids) and isinstance(ids[0], list)
        if build_answers:
            made = [answer(prompt_tokens, new_tokens, i) for i in range(len(ids) if batched else 1)]
            out = orjson.dumps(made if batched else made[0])
        else:
            out = bodies[len(ids)] if batched else bodies[1]
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(out)
        await resp.prepare(request)
        await resp.write(out)
        await resp.write_eof()
        state["written"].append(time.time())
        return resp

    async def start_round(request: web.Request) -> web.Response:
        state.update(expected=(await request.json())["requests"], arrived=[], written=[], all_in=asyncio.Event())
        return web.json_response({})

    async def last_round(request: web.Request) -> web.Response:
        return web.json_response({"arrived": state["arrived"], "written": state["written"]})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes([web.post("/generate", generate), web.post("/round", start_round), web.get("/round", last_round),
                    web.get("/health", health)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)


LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy


def control(url: str, method: str, body: dict | None = None) -> dict:
    """A call to the server's own routes, between rounds."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with LOOPBACK.open(req, timeout=30) as resp:
        return json.loads(resp.read())


def wait_ready(url: str, server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"rollout_http: the server exited with {server.returncode} before it answered")
        try:
            control(f"{url}/health", "GET")
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"rollout_http: the server at {url} did not answer /health in {timeout_s:.0f} s")


class GcTime:
    """Seconds this process spends in the cyclic garbage collector, and its full collections, while
    the ``with`` block runs."""

    def __init__(self):
        self.seconds, self.full, self._start = 0.0, 0, 0.0

    def __enter__(self) -> GcTime:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.full += info["generation"] == 2

    def take(self) -> tuple[float, int]:
        seconds, full = self.seconds, self.full
        self.seconds, self.full = 0.0, 0
        return seconds, full


async def rounds(url: str, prompts: list[list[int]], new_tokens: int, per_request: int, count: int) -> list[dict]:
    """``count`` timed rounds (after one warm-up) through one client, as the rollout keeps one."""
    from slime_ref.rollout.sglang_client import SGLangClient

    params = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    requests = [prompts[i:i + per_request] for i in range(0, len(prompts), per_request)]
    out = []
    async with SGLangClient(url, max_connections=len(requests) + 8) as client:
        async def send(batch: list[list[int]]) -> list:
            if per_request == 1:
                return [await client.generate(batch[0], params)]
            return await client.generate_batch(batch, params)

        with GcTime() as gc_time:
            for i in range(count + 1):
                control(f"{url}/round", "POST", {"requests": len(requests)})
                gc_time.take()
                start = time.time()
                # the last round's answers stay alive meanwhile, as a rollout's samples wait for training
                answers = await asyncio.gather(*[send(batch) for batch in requests])
                end = time.time()
                gc_s, full_collections = gc_time.take()
                times = control(f"{url}/round", "GET")
                received = sum(len(o.output_ids) for a in answers for o in a)
                if received != new_tokens * len(prompts) or len(times["arrived"]) != len(requests):
                    raise SystemExit(f"rollout_http: round {i}: {received} tokens in {len(times['arrived'])} requests, "
                                     f"expected {new_tokens * len(prompts)} in {len(requests)}")
                if i:  # the first round opens the connections
                    out.append({"head_s": round(max(times["arrived"]) - start, 4),
                                "answers_s": round(max(times["written"]) - min(times["written"]), 4),
                                "tail_s": round(end - max(times["written"]), 4),
                                "round_s": round(end - start, 4), "gc_s": round(gc_s, 4),
                                "full_collections": full_collections})
    return out


def parse_times(prompt_tokens: int, new_tokens: int, count: int) -> dict:
    """Seconds to parse one round's answer bodies (``count`` of them), json module against orjson."""
    import orjson

    bodies = [orjson.dumps(answer(prompt_tokens, new_tokens, i)) for i in range(count)]
    result = {"answer_bytes": len(bodies[0])}
    for name, loads in (("json", json.loads), ("orjson", orjson.loads)):
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            parsed = [loads(b) for b in bodies]
            runs.append(time.perf_counter() - start)
            del parsed
        result[name] = round(statistics.median(runs), 4)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=512, help="requests' prompts in a round (default 512)")
    p.add_argument("--new-tokens", type=int, default=512, help="tokens in each answer (default 512)")
    p.add_argument("--prompt-tokens", type=int, default=13, help="tokens in each prompt (default 13, the GRPO bench's)")
    p.add_argument("--prompts-per-request", type=int, nargs="+", default=[1], metavar="N",
                   help="send the prompts N to a /generate (SGLang's batched form); several values, one after "
                        "another on the same server")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per value, after one warm-up (default 5)")
    p.add_argument("--build-answers", action="store_true",
                   help="the server builds and serializes each answer when it writes it, as SGLang's tokenizer "
                        "manager does, instead of writing pre-serialized ones")
    p.add_argument("--rollout-imports", action="store_true",
                   help="the client process first imports what the rollout manager's process holds (Ray, "
                        "transformers, slime-ref's rollout), so that the garbage collector has as much to walk")
    p.add_argument("--freeze-gc", action="store_true",
                   help="before the rounds (after --rollout-imports), the rollout manager's garbage-collector "
                        "setting: what the process holds is frozen out of the collector's walks, and full "
                        "collections run a tenth as often")
    p.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the child process: its port
    args = p.parse_args()
    for name in ("prompts", "new_tokens", "prompt_tokens", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if min(args.prompts_per_request) < 1:
        p.error(f"--prompts-per-request: each must be at least 1, got {min(args.prompts_per_request)}")
    sizes = sorted({min(n, args.prompts) for n in args.prompts_per_request}
                   | {args.prompts % n for n in args.prompts_per_request if n > 1 and args.prompts % n})
    if args.serve is not None:
        serve(args.serve, args.prompt_tokens, args.new_tokens, sizes, args.build_answers)
        return

    from slime_ref.utils.net import allocate_port

    if args.rollout_imports:
        import ray  # noqa: F401
        import transformers  # noqa: F401

        import slime_ref.ray.rollout_manager  # noqa: F401
        import slime_ref.rollout.sglang_rollout  # noqa: F401
    if args.freeze_gc:
        from slime_ref.utils.gc_settings import freeze_after_setup

        freeze_after_setup()
    tracked = len(gc.get_objects())
    port = allocate_port()
    url = f"http://127.0.0.1:{port}"
    # the server shares this process's output (stdout and stderr as they are), and dies with it
    server = start_in_session([sys.executable, __file__, "--serve", str(port), "--prompts", str(args.prompts),
                               "--new-tokens", str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens),
                               "--prompts-per-request", *map(str, args.prompts_per_request),
                               *(["--build-answers"] if args.build_answers else [])],
                              stdout=None, stderr=None, with_parent=True)
    prompts = [[2 + (7 * i + j) % 30000 for j in range(args.prompt_tokens)] for i in range(args.prompts)]
    result = {"bench": "rollout_http", "prompts": args.prompts, "new_tokens": args.new_tokens,
              "prompt_tokens": args.prompt_tokens, "server_builds_answers": args.build_answers,
              "rollout_imports": args.rollout_imports, "gc_frozen": args.freeze_gc,
              "gc_tracked_objects_before": tracked, "cpu_count": os.cpu_count(), "by_prompts_per_request": {}}
    try:
        wait_ready(url, server)
        for n in args.prompts_per_request:
            each = asyncio.run(rounds(url, prompts, args.new_tokens, n, args.rounds))
            result["by_prompts_per_request"][str(n)] = {
                **{key: round(statistics.median(r[key] for r in each), 4) for key in each[0]}, "rounds": each}
    finally:
        stop_groups([server], terminate_s=30)
    result["server_pid"] = server.pid
    result["parse_s"] = parse_times(args.prompt_tokens, args.new_tokens, args.prompts)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
