"""The engines of one pull: each strategy's engine made on first use, sized by the run's budget."""

from __future__ import annotations

from manyfiles.s3.engines.base import Ctx, Engine
from manyfiles.s3.routing import Budget


class EngineSet:
    """The engines one run uses, by strategy name (``job.engine``), each started on first use.

    The producer submits to them and closes them when the listing is done (:meth:`close`); a run
    that stops early kills them (:meth:`kill`).
    """

    def __init__(self, ctx: Ctx, budget: Budget, *, strategy: str, sub_engine: str) -> None:
        self.ctx, self.budget = ctx, budget
        self.strategy = strategy        # "auto" sizes the lean pool as the small-object pool
        self.sub_engine = sub_engine    # what each worker of the processes engine runs
        self.started: dict[str, Engine] = {}

    def get(self, name: str) -> Engine:
        eng = self.started.get(name)
        if eng is None:
            eng = self.started[name] = self._start(name)
        return eng

    def close(self) -> None:
        """Everything submitted: let each engine finish its queue, then stop it."""
        for eng in self.started.values():
            eng.flush()
        for eng in list(self.started.values()):
            eng.close()

    def kill(self) -> None:
        """The run stopped early (an error, Ctrl-C, the caller stopped reading): abandon the work."""
        for eng in list(self.started.values()):
            eng.kill()

    def _start(self, name: str) -> Engine:
        from manyfiles.s3.engines.threads import ThreadsEngine

        ctx, bud = self.ctx, self.budget
        if name == "async":
            from manyfiles.s3.engines.aio import AsyncEngine

            return AsyncEngine(ctx, bud.small)
        if name == "http":
            from manyfiles.s3.engines.http import HttpEngine

            return HttpEngine(ctx, bud.small)
        if name == "loop":
            from manyfiles.s3.engines.loop import LoopEngine

            return LoopEngine(ctx, bud.small, lambda job: self.get("lean").submit(job))
        if name == "obstore":      # a candidate (issue 18): not used by auto
            from manyfiles.s3.engines.candidates import ObstoreEngine

            return ObstoreEngine(ctx, bud.small)
        if name == "crt":          # a candidate (issue 18): not used by auto
            from manyfiles.s3.engines.candidates import CrtEngine

            return CrtEngine(ctx, bud.small)
        if name == "sync":
            return ThreadsEngine(ctx, 1, name="sync")
        if name == "processes":
            from manyfiles.s3.engines.processes import ProcessesEngine

            return ProcessesEngine(ctx, bud.processes, max(1, bud.small // bud.processes), self.sub_engine)
        if name == "ranged":
            return ThreadsEngine(ctx, bud.big or bud.small, name="ranged", transport="lean")
        if name == "lean":
            n = bud.small if self.strategy in ("auto", "loop") else bud.big
            return ThreadsEngine(ctx, n, name="lean", transport="lean")
        return ThreadsEngine(ctx, bud.big or bud.small, name="threads")
