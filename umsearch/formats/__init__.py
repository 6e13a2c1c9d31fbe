"""A plan in other tools' terms: torch.distributed.pipelining's compute-only CSV schedule (``torch_csv``),
torchtitan's ``[parallelism]`` settings and ``plan_schedule.py`` recipe (``torchtitan``), and the
``baselines.json`` a search writes beside its plan (``baselines_file``). Pure Python, read from ``core``."""
