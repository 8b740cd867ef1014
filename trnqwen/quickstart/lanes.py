"""Run the quickstart's independent stages two at a time.

After the snapshot every training stage depends only on it (the override run also compares its
losses with the native fine-tune's, so it waits for that one).  One run at a time left a 2-core
machine half idle: a run's start-up (torchrun, imports, rendezvous) and its tail leave cores
free.  :func:`run_jobs` keeps ``workers`` stages going, in list order as their dependencies
finish; after a failure it starts nothing new and raises the first failure in list order once
the running stages have ended.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from trnqwen.rundir import next_run_id

WORKERS = 2


@dataclass
class Job:
    name: str
    run: Callable[[], object]
    after: tuple[str, ...] = field(default_factory=tuple)


def run_jobs(jobs: list[Job], workers: int = WORKERS) -> None:
    names = {j.name for j in jobs}
    cond = threading.Condition()
    pending = list(jobs)
    done: set[str] = set()
    failed: dict[str, BaseException] = {}

    def ready() -> "Job | None":
        for job in pending:
            if all(dep in done or dep not in names for dep in job.after):
                return job
        return None

    exited = [0]  # workers that have returned: counted by the workers themselves (see the Ctrl-C path)

    def worker() -> None:
        try:
            _work()
        finally:
            with cond:
                exited[0] += 1
                cond.notify_all()

    def _work() -> None:
        while True:
            with cond:
                while True:
                    if failed or not pending:
                        return
                    job = ready()
                    if job is not None:
                        pending.remove(job)
                        break
                    cond.wait()
            try:
                job.run()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
                with cond:
                    failed[job.name] = exc
                    cond.notify_all()
                return
            with cond:
                done.add(job.name)
                cond.notify_all()

    threads = [threading.Thread(target=worker, name=f"quickstart-lane-{i}", daemon=True)
               for i in range(max(1, min(workers, len(jobs))))]
    try:  # a Ctrl-C while the lanes are still starting stops the runs already started too
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except KeyboardInterrupt:  # only the main thread gets Ctrl-C: stop the lanes' runs, let them record it
        from trnqwen.train.stop_requests import request_stop

        with cond:
            failed.setdefault("", KeyboardInterrupt())  # start nothing new
        request_stop()
        # Not Thread.join(): on Python 3.11 a join interrupted by Ctrl-C marks that thread stopped, so
        # joining it again returns at once while it still runs (a run's record would be cut short).
        started = sum(1 for t in threads if t.ident is not None)
        with cond:
            while exited[0] < started:
                cond.wait()
        raise
    if failed:
        raise failed[next(j.name for j in jobs if j.name in failed)]


_ids_lock = threading.Lock()
_reserved: set[str] = set()


def reserve_run_id(runs_dir: Path, backend: str, *, method: str, lora: bool) -> str:
    """A run id of the usual shape (``<timestamp>-<backend>-<method>[-lora][-n]``) that no other
    stage of this process has taken: two runs planned in the same second would otherwise get one run dir."""
    with _ids_lock:
        base = next_run_id(runs_dir, backend, method=method, lora=lora)
        run_id, n = base, 0
        while run_id in _reserved or (Path(runs_dir) / run_id).exists():
            n += 1
            run_id = f"{base}-{n}"
        _reserved.add(run_id)
        return run_id
