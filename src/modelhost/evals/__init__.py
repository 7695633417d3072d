"""OpenAI's Evals API, run by the platform itself (docs/evals.md): evals (`store`), the graders of their
testing criteria (`graders`, pure functions), the data sources of their runs (`sources`), and the runner
that grades each item once through the batch tier (`runner`). `service.EvalService` is what the routes
and the rest of the server call.

For gated rollouts: `EvalService.evaluate(owner, eval_id, model, data_source=None, timeout=...)` runs
eval `eval_id` against the deployment `model` (its data source: the one given, else the eval's latest
`completions` run's, with `model` in it), waits for the run to end and returns its `Scores`: the pass
rate of each testing criterion (passed / graded items), the mean score of each, and the result counts.
"""
