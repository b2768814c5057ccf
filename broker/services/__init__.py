"""Services: each owns its transactions and calls the pure core, the database and the clouds.

API routes, CLI commands and Celery tasks call one service function each. Where each
behaviour lives:

- ``admission``: validate a submitted job, reserve its budget and queue it on its best plan;
- ``quoting``: ranked plans for a spec (quotes) or for a job's remaining work (re-plans),
  on the offers and throughput model of ``Planning``;
- ``plans``: the plan services pass and store (``ChosenPlan``, integer micro-dollars);
- ``steering``: whether a job should switch market now (asks ``core.policy.decide``);
- ``calibration``: learnt throughput corrections, read by quotes and updated after attempts;
- ``price_refresh``: spot prices from the clouds into ``Planning``'s offers;
- ``lifecycle``: every job state change, one function and one transaction each;
- ``billing``: what a running attempt costs, booked as it accrues; the budget alert;
- ``ledger``: reservations, releases and spend; team budgets and spend reports;
- ``runner``: launches, observes and stops instances, carrying out the decisions above;
- ``reconcile``: makes the clouds and the database agree (orphans, vanished instances);
- ``dispatch``: sends work to the Celery workers by task name; ``wiring`` builds the runner;
- ``teams``: teams, budgets, API keys and authentication;
- ``job_spec``: the job spec the API accepts; ``job_views``, ``dashboard``, ``metrics``:
  read-only views for the API, the dashboard and Prometheus.
"""
