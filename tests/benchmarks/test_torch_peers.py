"""benchmarks.torch_peers runs torch.distributed.pipelining's own schedules beside umsearch's plans (PlanSchedule)."""

from __future__ import annotations

import pytest

from tests.runtime.helpers import peer_plan


@pytest.mark.slow
def test_torch_and_umsearch_runtimes_run_side_by_side() -> None:
    from benchmarks.torch_peers import measure
    from umsearch.core.model_spec import ModelSpec
    from umsearch.runtime.model_source import spec_factory

    factory = spec_factory(ModelSpec.from_json({"source": "mlp", "args": {"layers": 4, "width": 32}}), 0)
    one = peer_plan("1F1B", 2, 1, 4, batch=8, layers=5)
    zbv = peer_plan("ZBVZeroBubble", 2, 2, 4, batch=8, layers=5)
    inter = peer_plan("Interleaved1F1B", 2, 2, 4, batch=8, layers=5)
    jobs = [("torch", one, "1F1B"), ("torch", zbv, "ZBVZeroBubble"), ("torch", inter, "Interleaved1F1B"),
            ("umsearch", one, None), ("umsearch", zbv, None)]  # fmt: skip
    times = measure(factory, jobs, ranks=2, rounds=2, warmup=1)
    assert len(times) == len(jobs) and all(len(t) == 2 and min(t) > 0 for t in times)
