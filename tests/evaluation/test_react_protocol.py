"""The `agent-react-v1` text protocol: reading replies into calls, rendering the history as text.

The expected layout is ToolBench's ReAct layout (`Thought:` / `Action:` / `Action Input:` lines, results
as `Observation:`), which its original agents used; the replies below are written as such models write
them (labels in markdown, JSON left open, fenced JSON, invented observations, several actions at once).
"""

from __future__ import annotations

import json

import pytest

from mirrorapi.evaluation.agent.environment import finish_status
from mirrorapi.evaluation.agent.search import react_as_tool_calls
from mirrorapi.evaluation.benchmark import parse_agents
from mirrorapi.prompts.agent_formats import (
    REACT_NO_ACTION,
    agent_messages,
    parse_react_step,
    react_conversation,
    react_grammar,
)

FUNCTION = "get_channel_clips_for_kick_com_api_kick_api"


def test_well_formed_reply():
    step = parse_react_step(
        f"Thought: I need the clips of the channel first.\nAction: {FUNCTION}\n"
        'Action Input: {"channel_name": "gmhikaru"}'
    )
    assert (step.thought, step.action, step.problem) == ("I need the clips of the channel first.", FUNCTION, "")
    assert json.loads(step.arguments) == {"channel_name": "gmhikaru"}


def test_a_function_name_beginning_with_an_underscore_keeps_it():
    """Names are cut to their last 64 characters, so some begin with `_` (4 functions of the test set): the label's
    markdown is stripped, not the name's first character; `__Action:__` is still read as a label."""
    cut = "_name_for_company_consultation_reportero_industrial_mexicano_api"
    assert parse_react_step(f"Thought: find it\nAction: {cut}\nAction Input: {{}}").action == cut
    assert parse_react_step(f"__Action:__ {cut}\n__Action Input:__ {{}}").action == cut


def test_finish_with_a_multiline_answer_and_markdown_labels():
    reply = (
        "**Thought:** I have both results.\n**Action:** `Finish`\n**Action Input:**\n```json\n"
        '{"return_type": "give_answer",\n "final_answer": "The channel gmhikaru has 3 clips."}\n```'
    )
    step = parse_react_step(reply)
    assert step.action == "Finish" and step.problem == ""
    assert json.loads(step.arguments) == {
        "return_type": "give_answer",
        "final_answer": "The channel gmhikaru has 3 clips.",
    }


def test_invented_observation_and_later_steps_are_dropped():
    reply = (
        f'Thought: get the clips\nAction: {FUNCTION}\nAction Input: {{"channel_name": "gmhikaru"}}\n'
        'Observation: {"clips": ["a", "b"]}\nThought: done\nAction: Finish\nAction Input: {}'
    )
    step = parse_react_step(reply)
    assert (step.action, json.loads(step.arguments)) == (FUNCTION, {"channel_name": "gmhikaru"})
    assert "Observation" in step.problem
    two = parse_react_step('Action: a_for_b\nAction Input: {"x": 1}\nAction: c_for_d\nAction Input: {"y": 2}')
    assert (two.action, json.loads(two.arguments)) == ("a_for_b", {"x": 1}) and "more than one" in two.problem


def test_malformed_arguments_are_repaired_or_passed_as_written():
    cut = parse_react_step(f'Action: {FUNCTION}\nAction Input: {{"channel_name": "gmhikaru')
    assert json.loads(cut.arguments) == {"channel_name": "gmhikaru"} and "repaired" in cut.problem
    prose = parse_react_step(f"Action: {FUNCTION}\nAction Input: the channel gmhikaru")
    # Not JSON at all: the server gets it as written, as StableToolBench sends a model's raw arguments.
    assert prose.arguments == "the channel gmhikaru" and "not JSON" in prose.problem


def test_missing_action_input_calls_without_arguments():
    step = parse_react_step(f"Thought: I will look at the clips.\nAction: {FUNCTION}")
    assert (step.action, step.arguments, step.problem) == (FUNCTION, "{}", "no Action Input")
    called = parse_react_step(f'Action: {FUNCTION}(channel_name="gmhikaru")')  # a Python-style call
    assert called.action == FUNCTION and called.arguments == "{}"


def test_no_action_is_a_thought_only():
    step = parse_react_step("Lionel Messi played for Barcelona, Paris Saint-Germain and Inter Miami.")
    assert step.action is None and step.arguments is None and step.problem == "no Action line"
    message = react_as_tool_calls({"role": "assistant", "content": "Lionel Messi played for Barcelona."})
    assert message == {"role": "assistant", "content": "Lionel Messi played for Barcelona.", "tool_calls": []}
    assert react_as_tool_calls({"role": "assistant", "content": None})["tool_calls"] == []


def test_unknown_function_name_is_kept_for_the_runner_to_reject():
    message = react_as_tool_calls({"content": 'Thought: search\nAction: google_search\nAction Input: {"q": "x"}'})
    assert message["tool_calls"] == [
        {"type": "function", "function": {"name": "google_search", "arguments": '{"q": "x"}'}}
    ]


def test_history_is_sent_as_text():
    history = agent_messages(
        "Show me the clips of gmhikaru.",
        [("kick_com_api_kick_api", "Kick.com data")],
        "agent-react-v1",
        functions=[
            {
                "type": "function",
                "function": {
                    "name": FUNCTION,
                    "description": "Channel clips.",
                    "parameters": {
                        "type": "object",
                        "properties": {"channel_name": {"type": "string"}},
                        "required": ["channel_name"],
                    },
                },
            }
        ],
    )
    assert f'{FUNCTION}: Channel clips.; arguments: {{"type":"object"' in history[0]["content"]
    assert "1.kick_com_api_kick_api: Kick.com data" in history[0]["content"]
    history += [
        {
            "role": "assistant",
            "content": "Get the clips.",
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": FUNCTION, "arguments": '{"channel_name": "gmhikaru"}'},
                }
            ],
        },
        {"role": "tool", "name": FUNCTION, "content": '{"error": "", "response": "[]"}', "tool_call_id": "call_1_0"},
        {"role": "assistant", "content": "Hmm."},
    ]
    sent = react_conversation(history)
    assert sent[:2] == history[:2]
    assert sent[2:] == [
        {
            "role": "assistant",
            "content": f'Thought: Get the clips.\nAction: {FUNCTION}\nAction Input: {{"channel_name": "gmhikaru"}}',
        },
        {"role": "user", "content": 'Observation: {"error": "", "response": "[]"}'},
        {"role": "assistant", "content": "Thought: Hmm."},
        {"role": "user", "content": REACT_NO_ACTION},
    ]
    # What was sent reads back into the same call.
    step = parse_react_step(sent[2]["content"])
    assert (step.thought, step.action, step.arguments) == ("Get the clips.", FUNCTION, '{"channel_name": "gmhikaru"}')


def test_agent_format_per_benchmark_agent():
    agents = parse_agents(
        [["replay", "recorded-agent", "http://127.0.0.1:1/v1"], ["smollm2", "/m", "http://127.0.0.1:2/v1"]],
        [["smollm2", "agent-react-v1"]],
    )
    assert [a.prompt_format for a in agents] == [None, "agent-react-v1"]
    with pytest.raises(ValueError, match="no --agent has that label"):
        parse_agents([["replay", "recorded-agent", "http://127.0.0.1:1/v1"]], [["smollm2", "agent-react-v1"]])
    with pytest.raises(ValueError, match="unknown prompt format"):
        parse_agents([["replay", "recorded-agent", "http://127.0.0.1:1/v1"]], [["replay", "react"]])


def test_react_grammar_is_valid_gbnf():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (not a project dependency) compiles GBNF")
    llama_cpp.LlamaGrammar.from_string(react_grammar([FUNCTION, "Finish"]), verbose=False)


def test_real_replies_of_an_untrained_small_model():
    """Replies SmolLM2-135M-Instruct gave to the first agent-react-v1 prompt of StableToolBench's example
    queries 608 and 1073 (llama.cpp, its Q4_1 GGUF, temperature 0): prose, no layout at all."""
    replies = [
        "I'm glad to help!\nYou can find the channel clips and details on their official website, "
        "Kick.com/mhikaru. They also have a dedicated page where you can read about their content.",
        "Sure, I'd be happy to help. Here are some popular sites and main keywords for the search query "
        '"birthday party ideas" that can inspire you:\n\n1. Facebook: Birthday Party Ideas\n2. Pinterest: '
        "Birthday Party Ideas\n3. Instagram: Birthday Party Ideas",
    ]
    for reply in replies:
        step = parse_react_step(reply)
        # "1. Facebook: ..." is not a label: nothing in prose becomes a call.
        assert (step.action, step.thought, step.problem) == (None, reply.strip(), "no Action line")


def test_real_grammar_constrained_reply_is_an_invalid_finish():
    """SmolLM2-135M-Instruct held to the layout by the reply grammar (llama.cpp) on query 608: it copies the
    prompt's words and calls Finish with a return_type that does not exist (the reply as the grammar makes
    it, put back together from the run's answer file). StableToolBench's Finish rules make that status 2."""
    reply = (
        "Thought: where you stand and what to do next, in at least five sentences\nAction: Finish\n"
        'Action Input: {"return_type" :"not a valid choice"}'
    )
    message = react_as_tool_calls({"content": reply})
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "Finish", "arguments": '{"return_type" :"not a valid choice"}'}
    assert finish_status(call["function"]["arguments"]) == ('{error:""return_type" is not a valid choice"}', 2)
