"""OpenAI's Evals API, run by the platform itself (docs/evals.md): evals, runs and results in the
database (`store`; OpenAI's objects of them, `views`), the graders of testing criteria (`graders`, pure
functions; `templates`, their bounded substitution), the data sources of runs (`sources`), and the
runner that grades each item once through the batch tier (`runner`). `service.EvalService` is what the
routes and the rest of the server call.

For gated rollouts: `await EvalService.evaluate(principal, eval_id, model, artifact_id=None,
data_source=None, timeout=3600)` runs eval `eval_id` against the deployment `model` (with
`artifact_id`: on that version of its rollout only, whatever its traffic split; the version must be
active or loading) through the batch tier, with its data source the one given, else the eval's latest
`completions` run's with `model` in it. It waits for the run to end and returns its `Scores`: the pass
rate of each testing criterion (passed / graded items), the mean score of each (None where no item has
a score), the run's status and its result counts. It is a run like any other: listed under the eval,
audited, its calls at low priority as the key's.
"""
