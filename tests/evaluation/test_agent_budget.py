"""The agents' budgets as StableToolBench's own loops spend them (toolbench/inference/Algorithms at aa4ed9f):
a Thought node for every reply whose `content` is not None, "" included (single_chain.py, DFS.py), each counting
against the depth limit; and DFS stops on the call that reaches `max_query_count`, before reading its reply
(DFS.py: `if self.query_count >= max_query_count: return 100000`).

The model is a stand-in that answers from a script (a real model's replies cannot be chosen beforehand), and so is
the virtual server (what it answers does not enter into a budget)."""

from __future__ import annotations

import asyncio
import json

import pytest

from mirrorapi.evaluation.agent.environment import QueryTools, ToolFunction
from mirrorapi.evaluation.agent.search import run_query
from mirrorapi.evaluation.agent.settings import AgentSettings

SEARCH = "search_for_mytool"


class ScriptedModel:
    """The engine's side: `reply(n)` is the n-th assistant message (1-based)."""

    def __init__(self, reply):
        self.reply, self.calls = reply, 0

    async def complete(self, messages, **options):
        self.calls += 1
        return self.reply(self.calls), {"total_tokens": 1}, "stop"


class AnsweringServer:
    async def call(self, function, arguments):
        return json.dumps({"error": "", "response": "a result"}), 0


def tool_call(name: str, arguments: dict) -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def run(model: ScriptedModel, method: str, **settings) -> dict:
    schema = {"type": "function", "function": {"name": SEARCH, "description": "", "parameters": {"type": "object"}}}
    tools = QueryTools([ToolFunction(SEARCH, "Data", "mytool", "search", schema)], [("mytool", "A tool")])
    agent = AgentSettings(
        server="http://127.0.0.1:9/virtual", base_urls=["http://127.0.0.1:9/v1"], model="m", method=method, **settings
    )
    return asyncio.run(run_query({"query": "q?", "query_id": 1}, tools, model, AnsweringServer(), agent))


@pytest.mark.parametrize("content, calls", [(None, 6), ("", 4), ("\n\n", 4), ("I will search.", 4)])
def test_a_reply_s_content_other_than_none_is_a_thought_that_counts_against_the_depth(content, calls):
    # Depth 12: a step is Thought + Action + Action Input (3 nodes) where the reply has content, else 2.
    model = ScriptedModel(lambda n: {"role": "assistant", "content": content, "tool_calls": [tool_call(SEARCH, {})]})
    run(model, "CoT@1", single_chain_max_step=12)
    assert model.calls == calls


def test_dfs_does_not_use_the_reply_of_the_call_that_reaches_the_budget():
    # Every reply calls the tool, but the 5th finishes with an answer: with 5 calls allowed, upstream counts the
    # 5th and stops before reading it, so no answer; with 6 allowed, it answers.
    def reply(n: int) -> dict:
        if n == 5:
            finish = {"return_type": "give_answer", "final_answer": "done"}
            return {"role": "assistant", "content": None, "tool_calls": [tool_call("Finish", finish)]}
        return {"role": "assistant", "content": None, "tool_calls": [tool_call(SEARCH, {"n": n})]}

    stopped = run(ScriptedModel(reply), "DFS_woFilter_w2", max_query_count=5)
    answered = run(ScriptedModel(reply), "DFS_woFilter_w2", max_query_count=6)
    assert (stopped["win"], stopped["answer_generation"]["query_count"]) == (False, 5)
    assert answered["win"] is True and "done" in answered["answer_generation"]["final_answer"]


def test_queries_without_a_query_id_are_named_by_their_place_in_the_file(tmp_path):
    # StableToolBench's runner names such a query by its index (rapidapi_multithread.py), so each has its own
    # answer file; they all wrote `None_<method>.json` before.
    from mirrorapi.evaluation.agent.files import load_queries

    queries = [
        {"query": "a?", "api_list": []},
        {"query": "b?", "api_list": [], "query_id": 77},
        {"query": "c?", "api_list": []},
    ]
    (tmp_path / "G1_instruction.json").write_text(json.dumps(queries))
    loaded = load_queries(tmp_path)["G1_instruction"]
    assert [q["query_id"] for q in loaded] == [0, 77, 2] and [q["query"] for q in loaded] == ["a?", "b?", "c?"]


def test_two_apis_cut_to_one_name_are_called_where_upstream_calls_them():
    """Names are cut to their last 64 characters, so two APIs of a tool with a long name may share one (4 of the
    765 test queries: G2_instruction 27543's `product_by_name` and `company_by_name` of one tool). StableToolBench's
    client sends the call to the API its `api_name_reflect` keeps, the last of that name in `api_list` order
    (rapidapi.py), with the first function's tool; the first was called here, and the other API never."""
    shared = "x" * 64

    def function(api: str) -> ToolFunction:
        return ToolFunction(shared, "Data", "tool", api, {"type": "function", "function": {"name": shared}})

    tools = QueryTools([function("product_by_name"), function("company_by_name")], [("tool", "A tool")])
    called = tools.find(shared)
    assert (called.category, called.tool, called.api) == ("Data", "tool", "company_by_name")
    assert tools.find(shared[-20:]).api == "company_by_name"  # the suffix match too
    assert tools.find("other") is None
