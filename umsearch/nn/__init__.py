"""Torch-only building blocks shared by profiling and the runtime: the model zoo, model building and
the split backward (``B`` / ``I`` / ``W``).

It sits below both :mod:`umsearch.measure` and :mod:`umsearch.runtime` and imports neither, so the
profiler times exactly the functions the runtime runs without the two packages importing each other.
The core (:mod:`umsearch.core`, :mod:`umsearch.sim`, :mod:`umsearch.search`) never imports it.
"""
