"""ParaScope's profiler package: trace loading and analysis (pure) and, in their own modules, the
profiling jobs (runtime). `python -m profiler <command>` dispatches in profiler/__main__.py.

    from profiler import load_traces
    traces = load_traces("runs/demo")

The trace API is imported lazily (PEP 562), so `import profiler.cli.run` pays for neither pandas
nor pyarrow, and nothing here ever imports torch.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "load_traces": "profiler.traces.loader",
    "Traces": "profiler.traces.model",
    "Limits": "profiler.traces.sources",
    "TraceError": "profiler.traces.errors",
    "TraceAnalysis": "profiler.analyzers.front",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
