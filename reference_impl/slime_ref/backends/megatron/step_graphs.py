"""``--cuda-graph-impl local --cuda-graph-scope full_iteration``: an optimizer step's forward and
backward, every micro-batch of it, replayed from one CUDA graph.

A step of a small model is bound by the host: Python issues some thousand kernels for each
micro-batch and the GPU waits for them. A CUDA graph records those launches once and replays them
with one call. Megatron-LM's full-iteration graph (``megatron/core/full_cuda_graph.py``) captures a
single graph after ``--cuda-graph-warmup-steps`` steps and assumes every later step has the same
shapes, which holds for pre-training on fixed-length sequences but not for RL, where every rollout
packs its responses differently. So here a graph belongs to a *step shape*: the packed lengths of
each micro-batch, the shapes of the per-sample loss tensors, and the step's sample and token counts
(which the loss divides by as Python numbers). A shape is captured once it has run eagerly
``warmup_steps`` times; later steps of that shape copy their tensors into the graph's inputs and
replay it. A shape that never repeats (free-length responses) keeps running eagerly, at eager speed.

What stays outside the graph: packing the micro-batches (host work that builds the inputs), the
gradient all-reduce of data parallelism (``finalize_model_grads``), the metrics read and the
optimizer. Inside, nothing may wait on the device or copy from the host: the index tensors the
forward and the loss build from Python lists (``slime_ref.utils.index_cache``) are built during an
eager run of the graph's own inputs just before the capture and kept with the graph.

Every step, eager or replayed, runs on one side stream, ``StepGraphs.stream``, and the actor builds
its DDP wrapper on it too: autograd's gradient-accumulation nodes keep the stream they were made on
(Megatron's DDP holds them from the start), and a backward whose accumulation nodes sit on another
stream than the capture would make the capture wait on that stream, which a capture may not do.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from slime_ref.backends.megatron.data import PackedMicroBatch, StepSchedule
from slime_ref.utils.index_cache import keep_indices


def step_shape(micro_batches: list[PackedMicroBatch], step: StepSchedule) -> tuple:
    """Everything a captured step bakes in: equal shapes replay the same graph."""
    def fields(mb):
        return tuple(sorted((k, tuple(None if v is None else (tuple(v.shape), v.dtype) for v in vs))
                            for k, vs in mb.fields.items()))

    return (step.num_samples, step.num_tokens,
            tuple((tuple(mb.total_lengths), tuple(mb.response_lengths), fields(mb)) for mb in micro_batches))


def _inputs(mb: PackedMicroBatch) -> list[torch.Tensor]:
    """The tensors of a micro-batch that change from step to step at one shape (the packing does not)."""
    return [mb.tokens] + [v for k in sorted(mb.fields) for v in mb.fields[k] if v is not None]


def _static_copy(mb: PackedMicroBatch) -> PackedMicroBatch:
    """The micro-batch with its tokens and per-sample tensors cloned: the graph's own input buffers."""
    return PackedMicroBatch(
        sample_indices=list(mb.sample_indices),
        tokens=mb.tokens.clone(),
        packed=mb.packed,
        total_lengths=list(mb.total_lengths),
        response_lengths=list(mb.response_lengths),
        fields={k: [None if v is None else v.clone() for v in vs] for k, vs in mb.fields.items()},
    )


class _CapturedStep:
    def __init__(self, graph, micro_batches: list[PackedMicroBatch], results, indices: dict):
        self.graph = graph
        self.micro_batches = micro_batches  # keeps the packing's tensors the graph reads alive
        self.inputs = [t for mb in micro_batches for t in _inputs(mb)]  # the buffers a replay refills
        self.results = results  # the metric tensors the graph writes
        self.indices = indices  # index tensors the graph reads, kept alive with it

    def replay(self, micro_batches: list[PackedMicroBatch]):
        torch._foreach_copy_(self.inputs, [t for mb in micro_batches for t in _inputs(mb)])
        self.graph.replay()
        return self.results


class StepGraphs:
    """CUDA graphs of whole forward-backward steps, one per step shape (see the module docstring).

    ``run(micro_batches, step, forward_backward)`` calls ``forward_backward(micro_batches)`` (the
    pipeline schedule over the step's micro-batches, without the gradient finalisation) eagerly or
    through a graph, and returns what it returns: the per-micro-batch metric dicts.
    """

    def __init__(self, warmup_steps: int, max_graphs: int = 8):
        self.warmup_steps = warmup_steps
        self.max_graphs = max_graphs
        self.stream = torch.cuda.Stream()  # see the module docstring
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: OrderedDict[tuple, _CapturedStep] = OrderedDict()
        self.eager_runs: dict[tuple, int] = {}
        self.counts = {"eager": 0, "captured": 0, "replayed": 0}

    def run(self, micro_batches: list[PackedMicroBatch], step: StepSchedule, forward_backward):
        caller = torch.cuda.current_stream()
        self.stream.wait_stream(caller)  # the inputs and the zeroed gradients are ready
        with torch.cuda.stream(self.stream):
            results = self._run(micro_batches, step, forward_backward)
        caller.wait_stream(self.stream)  # the gradients and metrics are ready for the optimizer
        return results

    def _run(self, micro_batches: list[PackedMicroBatch], step: StepSchedule, forward_backward):
        key = step_shape(micro_batches, step)
        captured = self.graphs.get(key)
        if captured is not None:
            self.graphs.move_to_end(key)
            self.counts["replayed"] += 1
            return captured.replay(micro_batches)
        runs = self.eager_runs.get(key, 0)
        if runs < self.warmup_steps:
            if len(self.eager_runs) >= 4096:  # a run whose shapes never repeat: forget, don't grow
                self.eager_runs.clear()
            self.eager_runs[key] = runs + 1
            self.counts["eager"] += 1
            return forward_backward(micro_batches)
        return self._capture(key, micro_batches, forward_backward)

    def _capture(self, key, micro_batches, forward_backward):
        """Run this step eagerly on fresh input buffers (its real result), then record it on them."""
        static = [_static_copy(mb) for mb in micro_batches]
        indices: dict = {}
        with keep_indices(indices):
            results = forward_backward(static)
        # a capture records kernels without running them: the gradients stay the eager run's
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"), \
                    keep_indices(indices):
                graph_results = forward_backward(static)
        except RuntimeError as e:
            # a failed capture leaves CUDA's and the allocator's capture state behind: this process
            # cannot go on reliably, so stop with what failed rather than limp on eagerly
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise RuntimeError(f"--cuda-graph-impl local: capturing a training step failed ({first}); "
                               "run without the CUDA graph flags") from e
        self.graphs[key] = _CapturedStep(graph, static, graph_results, indices)
        self.counts["captured"] += 1
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return results

