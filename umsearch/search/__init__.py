"""The search: from a profile and a search space to the fastest plan that fits memory.

Data flow, one module per idea:

- :mod:`~umsearch.search.space`: the TOML search space and CLI flags, validated.
- :mod:`~umsearch.search.baselines`: what users pick today (equal-microbatch
  GPipe and 1F1B with their best count and partition, a per-stage greedy
  choice), scored under the same model.
- :mod:`~umsearch.search.bound`: a lower bound on any plan's iteration time.
- :mod:`~umsearch.search.exhaustive`: the exact optimum of tiny instances (tests).
- :mod:`~umsearch.search.genome`: the genome is the plan; the space's rules and
  the repair that makes any edited plan valid.
- :mod:`~umsearch.search.moves`: small random edits of a plan.
- :mod:`~umsearch.search.operators`: pymoo sampling, crossover, mutation,
  repair and duplicate elimination on plan genomes.
- :mod:`~umsearch.search.problem`: the pymoo problem; scores a population in
  one batch-evaluator call.
- :mod:`~umsearch.search.local`: iterated local search that polishes the best plans.
- :mod:`~umsearch.search.driver`: baselines -> NSGA-II -> polish -> Pareto front.
- :mod:`~umsearch.cli.report` and :mod:`~umsearch.cli.search`: outputs and the CLI.
"""
