"""Every prompt format of the project, named and versioned, and the parsers of what models answer.

The data builders and the server call the same functions, so a model is always served with the
format it was trained on; the format name goes into the training data, the model card and the
cache provenance (`simulated:<model>@<format>`). One module per family; callers import the family's
module (this package re-exports nothing):
- `simulator_formats`: the simulator formats (`mirrorapi-v1`, `-v2`, `-session-v1`, `stabletoolbench*`), the
  observation schema and the response budget; `simulator_output` reads what a simulator answers;
- `agent_formats`: the agent formats of the benchmark runner (`agent-v1`, `agent-react-v1`) and the ReAct parser;
- `judge_formats`: the judge formats (`fac-v1`, `sopr-v1`, `sowr-v1`, `tooleyes-v1`) and their parsers.
"""
