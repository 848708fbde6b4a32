"""The lab of the multi-host tests (tests/netns/netlab.py) and its scenarios (scenarios.py).

One lab per session (these tests form one xdist group, run by one worker while the others go
on): a bridge, the S3 host, and per scenario a Dask site and a client host.  The scenarios the
selected tests ask for (``@pytest.mark.netfault(NAME)``) all start when the first of them is
needed, each in its own thread; a test waits for its scenario's outcome.  Everything is removed
at the end, also when a test fails; namespaces left by a session that died are swept first.
Where the machine cannot make network namespaces the tests fail with one line saying what is
missing (they are never skipped: CI and developer machines run them as root).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from netlab import Lab, missing, sweep
from scenarios import FIRST, OUTCOMES, SCENARIOS, Outcome, Stage
from sites import S3Server

SCENARIO_TIMEOUT = 300.0     # a scenario's own waits end well before (JOB_TIMEOUT and the like)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "netfault(name): the lab scenario whose outcome a multi-host test "
                                       "checks")


class Scenarios:
    """The scenarios of a session, started at once on first use; :meth:`outcome` waits for one."""

    def __init__(self, names: set[str], folder: Path) -> None:
        self.names = names
        self.folder = folder
        self.lab: Lab | None = None
        self.s3: S3Server | None = None
        self.threads: dict[str, threading.Thread] = {}
        self.results: dict[str, Outcome | BaseException] = {}
        self.started = 0.0
        self.wall: dict[str, dict] = {}     # scenario -> its moments, seconds since the start

    def start(self) -> None:
        if self.lab is not None:
            return
        why = missing()
        if why:
            pytest.fail(why, pytrace=False)
        sweep()
        self.started = time.monotonic()
        self.lab = Lab("t")
        logs = self.folder / "logs"
        logs.mkdir()
        self.s3 = S3Server(self.lab.host("s3"), logs / "s3.log")
        gate = threading.Event()
        firsts = [n for n in FIRST if n in self.names]
        if not firsts:
            gate.set()
        for name in sorted(self.names, key=lambda n: n not in firsts):
            stage = Stage(self.lab, self.s3, logs, self.folder / "data", name,
                          gate=None if name in firsts else gate)
            if name in firsts:
                stage.opens = gate
            thread = threading.Thread(target=self._run, args=(name, stage), name=f"netfault-{name}",
                                      daemon=True)
            self.threads[name] = thread
            thread.start()

    def _run(self, name: str, stage: Stage) -> None:
        try:
            SCENARIOS[name](stage)
            self.results[name] = stage.outcome
        except BaseException as exc:          # re-raised in the test that asks
            self.results[name] = exc
        finally:
            stage.open_gate()                 # (a first scenario that failed early lets the others go)
        o = stage.outcome
        self.wall[name] = {"ended": time.monotonic() - self.started,
                           **{m: t - self.started for m, t in o.moments.items()},
                           "runs": [(r.started - self.started, r.ended - self.started) for r in o.runs]}

    def outcome(self, name: str) -> Outcome:
        self.start()
        scenario = OUTCOMES.get(name, name)
        self.threads[scenario].join(SCENARIO_TIMEOUT)
        result = self.results.get(scenario)
        if result is None:
            raise AssertionError(f"scenario {scenario}: still running after {SCENARIO_TIMEOUT:.0f} s")
        if isinstance(result, BaseException):
            raise result
        return result if scenario == name else result.facts[name]

    def close(self) -> None:
        if self.lab is not None:
            cpu = {h.name: round(sum(_cpu_seconds(p.pid) for p in h.procs), 2) for h in self.lab.hosts}
            self.lab.close()          # kills every process it started, then its namespaces
            (self.folder / "wall.json").write_text(json.dumps({"wall": self.wall, "cpu": cpu}, indent=1))
        for thread in self.threads.values():
            thread.join(30)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (0 if it is gone: its time is not counted)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="session")
def netfaults(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``netfaults.outcome(NAME)``: what the scenario NAME saw (see scenarios.py)."""
    names = set()
    for item in request.session.items:
        for mark in item.iter_markers("netfault"):
            names.add(OUTCOMES.get(mark.args[0], mark.args[0]))
    runner = Scenarios(names, tmp_path_factory.mktemp("netfaults"))
    yield runner
    runner.close()
