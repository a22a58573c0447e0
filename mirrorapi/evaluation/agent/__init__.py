"""The benchmark's agent runner: an OpenAI-compatible tool-calling model against `/virtual`.

- `settings`: what a run is asked to do (`AgentSettings`, the methods);
- `environment`: the agent's side of a query (its functions, the calls to `/virtual`);
- `search`: one query's search (CoT chain or DFS tree) into StableToolBench's raw answer;
- `files`: the query files read and the answer files written;
- `run`: a whole run (every query not finished yet, concurrently; resumable).
"""
