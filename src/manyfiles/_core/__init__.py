"""What every tool of manyfiles shares (issue 19's core layer); nothing here imports a tool.

``report`` (the report base), ``progress`` (the live display), ``pool`` (the worker pool),
``retry`` (retries with backoff), ``units`` (sizes), ``extras`` (optional dependencies),
``lazy`` (lazy package exports), ``files_from`` (path lists), ``fsops`` (every mutation as one
traced primitive), ``glob`` (the one glob rule set), ``native`` (whether the C core
``manyfiles._dents`` built, and why not), ``worker`` (tracing and profiling in worker
processes), ``checkpoints`` (named moments of long operations where hooks may act; none in
production).

This ``__init__`` stays empty: fastls' start-up imports some of these modules.
"""
