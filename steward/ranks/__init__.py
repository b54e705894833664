"""A model over several ranks of one `mx.distributed` group, supervised as one worker.

The supervisor never learns of ranks: where it spawns a worker, `spawn_worker` gives it a
`RankGroup` (group.py) when the model runs over ranks, with the same handle a worker
process has (wire/process.py `Worker`). How a group is formed is formation.py; where its
ranks run, hostfile.py (`--hostfile`), child.py (here) and remote.py with tether.py (over
ssh); what each rank runs is worker/rank.py and worker/lockstep.py.
"""

from __future__ import annotations

from steward.ranks.group import RankGroup
from steward.wire.process import Worker, WorkerProcess
from steward.wire.settings import WorkerSettings


async def spawn_worker(settings: WorkerSettings) -> Worker:
    """One worker process, or a group of `settings.ranks` ranks seen as one."""
    if settings.ranks > 1:
        return await RankGroup.spawn(settings)
    return await WorkerProcess.spawn(settings)
