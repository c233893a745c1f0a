"""slime's trace helpers for custom rollout and reward code, for the rehearsal.

Served as ``slime.utils.trace_utils`` to hooks written for slime v0.3.1 and as
``slime.observability.trace_utils`` to hooks written for slime main (slime #2298 moved it). A hook
calls them as it would on slime: ``trace_span(sample, "verify")`` as a context manager,
``trace_event``, ``@trace_function("name", target="sample")`` on sync and async functions,
``bind_trace(sample)`` and ``build_sglang_meta_trace_attrs(meta_info)``. Each records its events on
``sample.trace`` (``{"version", "trace_id", "events": [...]}``, the carrier slime saves with
``--save-debug-rollout-data``); slime-ref draws no timeline from them. As on slime, tracing never
fails the code it wraps: a target that is not a Sample, a TraceHandle or a list of them is skipped.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from slime_ref.types import Sample

__all__ = ["TRACE_VERSION", "TRACE_CHILDREN_KEY", "SGLANG_TRACE_META_KEYS", "TraceHandle", "TraceSpanContext",
           "bind_trace", "bind_trace_carrier", "build_sglang_meta_trace_attrs", "export_trace", "import_trace",
           "trace_event", "trace_function", "trace_next_attempt", "trace_span"]

TRACE_VERSION = 1
TRACE_CHILDREN_KEY = "_trace_children"
SGLANG_TRACE_META_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens", "queue_time", "e2e_latency",
                          "decode_throughput")

_open_spans: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("compat_trace_spans",
                                                                                          default=())


@dataclass
class TraceHandle:
    trace_id: str
    carrier: dict[str, Any]
    sample_id: int | str | None = None
    group_id: int | str | None = None
    attempt: int = 0
    parent_span_id: str | None = None


@dataclass
class TraceSpanContext:
    """What ``with trace_span(...) as span`` gives: attributes set on it land on the span's end event."""

    target: Any
    handles: list[TraceHandle]
    end_attrs: dict[str, Any] = field(default_factory=dict)

    def set(self, key: str, value: Any) -> TraceSpanContext:
        self.end_attrs[key] = value
        return self

    def update(self, attrs: dict[str, Any] | None) -> TraceSpanContext:
        self.end_attrs.update({k: v for k, v in (attrs or {}).items() if k != TRACE_CHILDREN_KEY})
        return self

    set_attr = set
    update_attrs = update


def _carrier(carrier: dict | None, trace_id=None, sample_id=None, group_id=None, attempt: int = 0) -> dict:
    carrier = {} if carrier is None else carrier
    carrier.setdefault("version", TRACE_VERSION)
    carrier.setdefault("trace_id", trace_id or uuid.uuid4().hex)
    carrier.setdefault("events", [])
    for key, value in (("sample_id", sample_id), ("group_id", group_id)):
        if value is not None or key not in carrier:
            carrier[key] = value
    carrier["attempt"] = int(carrier.get("attempt", attempt))
    return carrier


def bind_trace_carrier(carrier: dict | None, *, trace_id=None, sample_id=None, group_id=None, attempt: int = 0,
                       parent_span_id: str | None = None) -> TraceHandle:
    trace = _carrier(carrier, trace_id, sample_id, group_id, attempt)
    return TraceHandle(trace["trace_id"], trace, trace["sample_id"], trace["group_id"], trace["attempt"],
                       parent_span_id)


def bind_trace(sample: Sample) -> TraceHandle:
    """The sample's trace handle; gives the sample a carrier (``sample.trace``) if it has none."""
    sample.trace = _carrier(getattr(sample, "trace", None), sample_id=sample.index, group_id=sample.group_index)
    return bind_trace_carrier(sample.trace)


def export_trace(handle: TraceHandle) -> dict[str, Any]:
    return {"version": TRACE_VERSION, "trace_id": handle.trace_id, "sample_id": handle.sample_id,
            "group_id": handle.group_id, "attempt": handle.attempt,
            "parent_span_id": handle.parent_span_id or _parent(handle.trace_id)}


def import_trace(payload: dict[str, Any], carrier: dict | None = None) -> TraceHandle:
    return bind_trace_carrier(carrier, trace_id=payload.get("trace_id"), sample_id=payload.get("sample_id"),
                              group_id=payload.get("group_id"), attempt=int(payload.get("attempt", 0)),
                              parent_span_id=payload.get("parent_span_id"))


def _handles(target) -> list[TraceHandle]:
    if isinstance(target, TraceHandle):
        return [target]
    if isinstance(target, Sample):
        return [bind_trace(target)]
    if isinstance(target, (list, tuple)):
        return [h for item in target for h in _handles(item)]
    return []


def _parent(trace_id: str) -> str | None:
    return next((span for tid, span in reversed(_open_spans.get()) if tid == trace_id), None)


def _record(handle: TraceHandle, kind: str, name: str, attrs=None, span_id=None, parent=None) -> None:
    event = {"type": kind, "name": name, "ts": time.time(), "trace_id": handle.trace_id,
             "sample_id": handle.sample_id, "group_id": handle.group_id,
             "attempt": int(handle.carrier.get("attempt", handle.attempt))}
    if span_id:
        event["span_id"] = span_id
    if parent:
        event["parent_span_id"] = parent
    if attrs:
        event["attrs"] = dict(attrs)
    handle.carrier["events"].append(event)


def trace_event(target, name: str, *, attrs: dict[str, Any] | None = None) -> None:
    """An instant event on each of the target's traces."""
    for handle in _handles(target):
        _record(handle, "event", name, attrs, parent=handle.parent_span_id or _parent(handle.trace_id))


@contextmanager
def trace_span(target, name: str, *, attrs: dict[str, Any] | None = None, record_error: bool = True):
    """A span around the block on each of the target's traces; yields a :class:`TraceSpanContext`
    (the target itself where it holds no trace)."""
    handles = _handles(target)
    if not handles:
        yield target
        return
    spans = []
    for handle in handles:
        span_id = uuid.uuid4().hex
        _record(handle, "span_start", name, attrs, span_id, handle.parent_span_id or _parent(handle.trace_id))
        spans.append((handle, span_id))
    token = _open_spans.set(_open_spans.get() + tuple((h.trace_id, s) for h, s in spans))
    context = TraceSpanContext(handles[0] if len(handles) == 1 else handles, handles)
    try:
        yield context
    except BaseException as e:
        if record_error:
            context.update({"error_type": type(e).__name__, "error_message": str(e)})
        raise
    finally:
        _open_spans.reset(token)
        for handle, span_id in spans:
            _record(handle, "span_end", name, context.end_attrs, span_id)


def trace_next_attempt(target, *, attrs: dict[str, Any] | None = None):
    """Count a retry on each of the target's traces (an ``attempt_start`` event)."""
    handles = _handles(target)
    for handle in handles:
        handle.attempt = handle.carrier["attempt"] = int(handle.carrier.get("attempt", 0)) + 1
        trace_event(handle, "attempt_start", attrs={"attempt": handle.attempt, **(attrs or {})})
    if not handles:
        return target
    return handles[0] if len(handles) == 1 else handles


def _target_of(fn, args, kwargs, target: str | None, target_getter):
    if target_getter is not None:
        return target_getter(*args, **kwargs)
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return None
    if target is not None:
        return bound.get(target)
    return next((v for v in bound.values() if _handles(v)), None)  # the first traceable argument


def trace_function(name: str, *, target: str | None = None, target_getter=None, attrs_getter=None,
                   record_error: bool = True):
    """A decorator: the whole call, sync or async, is one span on the target argument's traces
    (``target="sample"`` names the parameter; ``target_getter`` derives it from the arguments)."""

    def decorate(fn):
        def begin(args, kwargs):
            found = _target_of(fn, args, kwargs, target, target_getter)
            attrs = attrs_getter(*args, **kwargs) if attrs_getter is not None else None
            return trace_span(found, name, attrs=attrs, record_error=record_error)

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def traced_async(*args, **kwargs):
                with begin(args, kwargs):
                    return await fn(*args, **kwargs)

            return traced_async

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            with begin(args, kwargs):
                return fn(*args, **kwargs)

        return traced

    return decorate


def build_sglang_meta_trace_attrs(meta: dict[str, Any]) -> dict[str, Any]:
    """Span attributes from an SGLang ``meta_info``: token counts and timings, the finish reason's
    type and the request id (slime also derives prefill/decode child spans from PD timings; the
    rehearsal's engine reports none)."""
    attrs = {key: meta[key] for key in SGLANG_TRACE_META_KEYS if meta.get(key) is not None}
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        reason = reason.get("type")
    if reason is not None:
        attrs["finish_reason"] = reason
    if meta.get("id") is not None:
        attrs["sglang_request_id"] = meta["id"]
    return attrs
