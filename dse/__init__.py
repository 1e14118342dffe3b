"""dse: search the LLM-serving design space with Optuna, Ray and MLflow over ``sim``.

``dse search SPACE.yaml --out DIR`` runs (or resumes) a study: Optuna proposes knob values
(by default NSGA-II after an initial design, with local search around the front:
``dse.sampling``; SLOs as normalised constraints), a pool of
long-lived Ray actors simulates each configuration with ``sim.simulate``, and the driver,
the only writer, tells Optuna (journal file ``DIR/study.journal``) and logs one MLflow
child run per trial under one parent run (``sqlite:///DIR/mlflow.db`` by default). Results:
``trials.csv``, ``pareto.csv`` (feasible non-dominated trials), ``report.html`` and
``best/`` (cluster JSON + ``vllm serve`` command per Pareto configuration).

Space file fields: the pydantic models in ``dse/schema.py`` (the README's field reference
is generated from them, ``python -m dse.reference``); examples in ``search_spaces/``.
"""

from dse.space import Space, load_space, parse_space
from dse.study import Driver, run_search

__all__ = ["Driver", "Space", "load_space", "parse_space", "run_search"]
