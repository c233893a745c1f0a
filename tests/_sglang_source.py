"""Read SGLang 0.5.15.post1's HTTP contract from its wheel, without importing it.

The wheel is fetched once with ``pip download --no-deps`` into a cache directory
(``$SLIME_REF_SGLANG_WHEEL_DIR``, default ``~/.cache/slime-ref/sglang-wheel``). Its
``srt/entrypoints/http_server.py`` gives the routes (path, methods, request dataclass of the handler),
``srt/managers/io_struct.py`` the request fields, ``srt/sampling/sampling_params.py`` the sampling
parameters, ``srt/server_args.py`` the server arguments ``/server_info`` reports. Everything is parsed with ``ast``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

SGLANG_VERSION = "0.5.15.post1"
# meta_info keys of a real SGLang 0.5.15.post1 /generate answer with return_logprob, captured on an
# offline H200 (driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130) on 2026-11-29. They come from the
# tokenizer manager, not from the files parsed here.
SGLANG_META_INFO_KEYS = {
    "id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "cached_tokens_details",
    "weight_version", "num_retractions", "input_token_logprobs", "output_token_logprobs",
    "output_token_logprobs_length", "reasoning_tokens", "dp_rank", "e2e_latency", "response_sent_to_client_ts",
}
_FILES = {
    "http_server": "sglang/srt/entrypoints/http_server.py",
    "io_struct": "sglang/srt/managers/io_struct.py",
    "sampling_params": "sglang/srt/sampling/sampling_params.py",
    "server_args": "sglang/srt/server_args.py",
}


def wheel_cache_dir() -> Path:
    default = Path.home() / ".cache" / "slime-ref" / "sglang-wheel"
    return Path(os.environ.get("SLIME_REF_SGLANG_WHEEL_DIR", default))


def fetch_wheel() -> tuple[Path | None, str]:
    """The cached wheel, downloading it if needed; (None, why) when it cannot be had."""
    cache = wheel_cache_dir()
    found = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0], ""
    cache.mkdir(parents=True, exist_ok=True)
    # A fixed target (CPython 3.11, manylinux x86_64) so any host fetches the same file.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
           "--platform", "manylinux_2_34_x86_64", "-d", str(cache), f"sglang=={SGLANG_VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"pip download failed: {e}"
    found = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if not found:
        return None, f"pip download sglang=={SGLANG_VERSION} failed: {proc.stderr.strip()[-300:]}"
    return found[0], ""


@dataclass
class Route:
    methods: set[str] = field(default_factory=set)
    request_class: str | None = None
    handler: str = ""


@dataclass
class SGLangSource:
    routes: dict[str, Route]
    classes: dict[str, set[str]]  # io_struct class -> its fields, inherited ones included
    sampling_fields: set[str]
    server_args: set[str]  # ServerArgs fields: the keys of /server_info
    handler_dict_keys: dict[str, set[str]]  # handler name -> keys of the dict literals it returns


def _fields(tree: ast.Module) -> dict[str, set[str]]:
    defs = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    cache: dict[str, set[str]] = {}

    def of(name: str) -> set[str]:
        if name not in cache:
            node = defs[name]
            own = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in defs:
                    own |= of(base.id)
            cache[name] = own
        return cache[name]

    return {name: of(name) for name in defs}


def _routes(tree: ast.Module, class_names: set[str]) -> dict[str, Route]:
    routes: dict[str, Route] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and isinstance(dec.func.value, ast.Name) and dec.func.value.id == "app"):
                continue
            if not dec.args or not isinstance(dec.args[0], ast.Constant):
                continue  # paths taken from the environment
            kind = dec.func.attr
            if kind == "api_route":
                methods = {m.value for kw in dec.keywords if kw.arg == "methods"
                           for m in kw.value.elts if isinstance(m, ast.Constant)}
            elif kind in ("get", "post", "put", "delete", "head"):
                methods = {kind.upper()}
            else:
                continue
            route = routes.setdefault(dec.args[0].value, Route(handler=node.name))
            route.methods |= methods
            for arg in node.args.args:
                if arg.annotation is None:
                    continue
                names = {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)} & class_names
                if names:
                    route.request_class = names.pop()
    return routes


def _returned_dict_keys(tree: ast.Module) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            keys = {k.value for d in ast.walk(node) if isinstance(d, ast.Dict)
                    for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            out[node.name] = keys
    return out


def parse_wheel(wheel: Path) -> SGLangSource:
    with zipfile.ZipFile(wheel) as zf:
        trees = {key: ast.parse(zf.read(path).decode("utf-8")) for key, path in _FILES.items()}
    classes = _fields(trees["io_struct"])
    sampling = _fields(trees["sampling_params"])["SamplingParams"]
    return SGLangSource(
        routes=_routes(trees["http_server"], set(classes)),
        classes=classes,
        sampling_fields=sampling,
        server_args=_fields(trees["server_args"])["ServerArgs"],
        handler_dict_keys=_returned_dict_keys(trees["http_server"]),
    )
