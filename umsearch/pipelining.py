"""umsearch plans inside torch.distributed.pipelining: ``from umsearch.pipelining import PlanSchedule``.

The schedule lives in :mod:`umsearch.runtime.plan_schedule`; this module is
its public name, beside torch's own ``torch.distributed.pipelining``.
"""

from umsearch.runtime.plan_schedule import PlanSchedule

__all__ = ["PlanSchedule"]
