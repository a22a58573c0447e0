"""The agent runner end to end: a RECORDED agent (replaying StableToolBench's real trajectories; the only
stand-in), the real virtual server in replay mode over a real cache built from the recorded
observations, the real converter and the real judges.

The judge is the untrained tiny model (`tiny_engine`): these tests check formats, counts and
decisions, not verdict quality, and training the judge costs minutes (tests/evaluation/conftest.py).
Expected values come from StableToolBench's files (data/samples/stabletoolbench, copied unchanged from
its `data_example`) and from what its `convert_to_answer_format.py` reads (its code at aa4ed9f).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.processes import free_port, stop
from harness.recorded_agent import load_recordings, recorded_cache_folder, serve_recorded_agent

GROUP = "G1_instruction"
IDS = ("588", "608", "1073")
FOLDERS = {"CoT@1": "virtual_chatgpt_cot", "DFS_woFilter_w2": "virtual_chatgpt_dfs"}


@pytest.fixture(scope="module")
def world(samples, tmp_path_factory, virtual_server_process):
    """Queries, recordings, and a virtual server (replay mode) whose cache holds the recorded observations."""
    stb = samples / "stabletoolbench"
    queries = stb / "solvable_queries_example" / "test_instruction" / f"{GROUP}.json"
    answers = stb / "data_example" / "answer"
    root = tmp_path_factory.mktemp("agent")
    for folder in FOLDERS.values():
        recorded_cache_folder(load_recordings([answers / folder]), json.loads(queries.read_text()), root / "cache")
    url, _, process, output = virtual_server_process(
        root / "server",
        samples,
        "http://127.0.0.1:9/v1",
        "no-engine",
        mode="replay",
        cache_folder=root / "cache",
        tools_folder=f"[{samples / 'tools'}, {queries}]",
    )
    yield {
        "queries": queries,
        "answers": answers,
        "server": url + "/virtual",
        "root": root,
        "stb": stb,
        "tools": samples / "tools",
    }
    stop(process)
    output.close()


def _run(eval_cli, world, base_url: str, method: str, out: Path, *extra: str) -> int:
    return eval_cli("run_agent")(
        [
            "--queries",
            str(world["queries"]),
            "--server",
            world["server"],
            "--base-url",
            base_url,
            "--model",
            "recorded-agent",
            "--method",
            method,
            "--out",
            str(out),
            "--tools",
            str(world["tools"]),
            "--no-progress",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def recorded_runs(world, eval_cli):
    """CoT and DFS runs with the recorded agent of each method; {method: (out folder, engine requests)}."""
    runs = {}
    for method, folder in FOLDERS.items():
        with serve_recorded_agent([world["answers"] / folder], free_port()) as (base_url, agent):
            out = world["root"] / method
            assert _run(eval_cli, world, base_url, method, out) == 0
            runs[method] = (out, agent.requests)
    return runs


def _raw(out: Path, qid: str, method: str) -> dict:
    return json.loads((out / "answer" / GROUP / f"{qid}_{method}.json").read_text())


def assert_stabletoolbench_converter_reads(data: dict, method: str) -> None:
    """The fields `convert_to_answer_format.py` reads, and the shapes it assumes without checking."""
    generation = data["answer_generation"]
    assert {"valid_data", "final_answer", "function", "query"} <= set(generation)
    if generation["valid_data"]:
        _assert_conversation(generation["train_messages"][-1])
    elif "CoT" in method:
        _assert_chains(data["trys"])
    else:
        for child in data["tree"]["tree"]["children"]:
            _assert_tree(child)


def _assert_conversation(conversation: list[dict]) -> None:
    """A valid answer's last conversation, as the converter walks it."""
    for index, message in enumerate(conversation[2:], 2):
        assert message["role"] in {"system", "user", "function", "tool", "assistant"}
        if message["role"] != "assistant":
            continue
        if "function_call" in message:  # it indexes ["name"] without a None check: its crash
            assert isinstance(message["function_call"], dict) and {"name", "arguments"} <= set(
                message["function_call"]
            )
        elif message.get("tool_calls") is not None:
            for call in message["tool_calls"]:
                name, _ = call["function"]["name"], call["function"]["arguments"]
                if name == "Finish":
                    break
                assert any(
                    m["role"] == "tool" and m.get("tool_call_id") == call["id"] and "content" in m
                    for m in conversation[index + 1 :]
                ), call
        else:
            assert "content" in message


def _assert_chains(trials: list[dict]) -> None:
    """CoT's trials without a valid answer: Thought and Action nodes, each Action followed by its observation."""
    for trial in trials:
        chain, index = trial["chain"], 0
        while index < len(chain):
            assert chain[index]["node_type"] in ("Action", "Thought")
            if chain[index]["node_type"] == "Action":
                assert {"description", "observation"} <= set(chain[index + 1])
                index += 1
            index += 1


def _assert_tree(node: dict) -> None:
    """DFS's tree without a valid answer: every node described, every Action Input observed."""
    assert node["node_type"] in ("Thought", "Action", "Action Input") and "description" in node
    if node["node_type"] == "Action Input":
        assert "observation" in node
    for child in node["children"]:
        _assert_tree(child)


def _tool_path(record: dict) -> list[tuple[str, object]]:
    calls, node = [], record["answer"]["answer_details"][0]
    while node:
        if node["role"] == "tool":
            calls.append((node["message"]["name"], json.loads(node["message"]["arguments"], strict=False)))
        node = node["next"][0] if node["next"] else None
    return calls


def test_runs_write_raw_files_stabletoolbench_converts_and_fac_scores(
    recorded_runs, world, eval_cli, tiny_engine, tmp_path
):
    for method, folder in FOLDERS.items():
        out, _ = recorded_runs[method]
        converted = json.loads((out / f"{GROUP}.json").read_text())
        recorded = json.loads(
            (world["stb"] / "data_example" / "model_predictions_converted" / folder / f"{GROUP}.json").read_text()
        )
        assert sorted(converted) == sorted(IDS)
        for qid in IDS:
            data = _raw(out, qid, method)
            assert_stabletoolbench_converter_reads(data, method)
            assert data["agent_settings"]["model"] == "recorded-agent" and data["agent_settings"]["method"] == method
            assert converted[qid]["agent"]["method"] == method
            real = json.loads((world["answers"] / folder / GROUP / f"{qid}_{method}.json").read_text())
            real_names = {f.get("name") or f["function"]["name"] for f in real["answer_generation"]["function"]}
            assert {f["function"]["name"] for f in data["answer_generation"]["function"]} == real_names
            # Replaying the real run reproduces its final answer and the tool calls of its answer path.
            assert data["answer_generation"]["final_answer"] == real["answer_generation"]["final_answer"]
            assert _tool_path(converted[qid]) == _tool_path(recorded[qid])
            # Tool call ids a Mistral chat template takes in the next request's history: 9 letters or digits
            for messages in data["answer_generation"]["train_messages"]:
                ids = [call["id"] for message in messages for call in message.get("tool_calls") or []]
                assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids) and len(set(ids)) == len(ids)
    # 588's CoT run never finished in StableToolBench's data; the replay does not either.
    assert _raw(recorded_runs["CoT@1"][0], "588", "CoT@1")["answer_generation"]["valid_data"] is False
    answers = tmp_path / "answers"
    for method in FOLDERS:
        (answers / method).mkdir(parents=True)
        (answers / method / f"{GROUP}.json").write_text((recorded_runs[method][0] / f"{GROUP}.json").read_text())
    ids = world["stb"] / "solvable_queries_example" / "test_query_ids"
    code = eval_cli("fac")(
        [
            "--answers",
            str(answers),
            "--ids",
            str(ids),
            "--base-url",
            tiny_engine.base_url,
            "--model",
            tiny_engine.model,
            "--out",
            str(tmp_path / "fac"),
            "--max-tokens",
            "8",
            "--no-progress",
        ]
    )
    assert code == 0
    table = json.loads((tmp_path / "fac" / "fac.json").read_text())
    assert [row["model"] for row in table["rows"]] == sorted(FOLDERS)
    cot = table["rows"][0]["groups"][GROUP]
    assert cot["ids"] == 3 and cot["empty"] == 1 and cot["judge_calls"] == 2  # 588 has no final answer


def test_dfs_backtracks_on_give_up(recorded_runs):
    out, _ = recorded_runs["DFS_woFilter_w2"]
    data = _raw(out, "588", "DFS_woFilter_w2")
    nodes = []

    def walk(node):
        nodes.append(node)
        for child in node["children"]:
            walk(child)

    walk(data["tree"]["tree"])
    give_ups = [n for n in nodes if n["node_type"] == "Action Input" and n.get("observation_code") == 4]
    answer = [n for n in nodes if n["node_type"] == "Action Input" and n.get("observation_code") == 3]
    assert give_ups and all(n["pruned"] for n in give_ups)
    assert len(answer) == 1 and answer[0]["expand_num"] > max(n["expand_num"] for n in give_ups)
    # After a give-up the search went back and asked for different actions at an earlier node.
    assert any(len(n["children"]) == 2 for n in nodes)
    assert data["answer_generation"]["finish_type"] == "give_answer"
    assert data["forward_args"]["tree_beam_size"] == 2 and data["forward_args"]["max_query_count"] == 200


@pytest.mark.parametrize("method", list(FOLDERS))
def test_a_replay_makes_the_recorded_model_calls_and_search(recorded_runs, world, method):
    """The recorded agent merged every recorded thought with the call after it into one reply, where a thought may
    have been a model reply of its own (text, no call): the replay of DFS 588 made 27 model calls where the
    recording made 30, and backtracked from another node, never exploring a branch of the recorded search (CoT 608
    and 1073: 3 calls of 4). Against StableToolBench's own files: the same calls, and for DFS the same tree."""
    out, _ = recorded_runs[method]

    def shape(node: dict) -> list:
        return [node["node_type"], node["description"], [shape(child) for child in node["children"]]]

    for query in IDS:
        recorded = json.loads((world["answers"] / FOLDERS[method] / GROUP / f"{query}_{method}.json").read_text())
        replayed = _raw(out, query, method)
        calls = (recorded["answer_generation"]["query_count"], replayed["answer_generation"]["query_count"])
        assert calls[0] == calls[1], (query, calls)
        if method.startswith("DFS"):
            assert shape(replayed["tree"]["tree"]) == shape(recorded["tree"]["tree"]), query


def test_rerun_skips_finished_queries(recorded_runs, world, eval_cli, capsys):
    out, _ = recorded_runs["CoT@1"]
    (out / "answer" / GROUP / "608_CoT@1.json").unlink()
    with serve_recorded_agent([world["answers"] / "virtual_chatgpt_cot"], free_port()) as (base_url, agent):
        assert _run(eval_cli, world, base_url, "CoT@1", out) == 0
        assert "1 queries answered, 2 done before" in capsys.readouterr().out
        assert agent.requests == 4  # 608's four recorded model calls only (its query_count)
        assert _run(eval_cli, world, base_url, "CoT@1", out) == 0
        assert agent.requests == 4
        # Another model's run into the same folder is refused, not mixed in.
        assert (
            eval_cli("run_agent")(
                [
                    "--queries",
                    str(world["queries"]),
                    "--server",
                    world["server"],
                    "--base-url",
                    base_url,
                    "--model",
                    "other-model",
                    "--out",
                    str(out),
                    "--no-progress",
                ]
            )
            == 2
        )
        assert "holds an answer of model 'recorded-agent'" in capsys.readouterr().err
    assert "608" in json.loads((out / f"{GROUP}.json").read_text())


def test_a_run_of_another_method_into_the_same_folder_is_refused(recorded_runs, world, eval_cli, capsys):
    # The converted <group>.json, which FAC scores under the folder's name, is rebuilt from one method's answers.
    out, _ = recorded_runs["CoT@1"]
    converted = (out / f"{GROUP}.json").read_text()
    assert _run(eval_cli, world, "http://127.0.0.1:9/v1", "DFS_woFilter_w2", out) == 2
    assert "holds an answer of model 'recorded-agent' (CoT@1)" in capsys.readouterr().err
    assert (out / f"{GROUP}.json").read_text() == converted
    assert not list((out / "answer" / GROUP).glob("*_DFS_woFilter_w2.json"))


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--temperature", "0.7"], "temperature 0.0 (now 0.7)"),
        (["--single-chain-max-step", "4"], "single_chain_max_step 12 (now 4)"),
        (["--max-tokens", "64"], "max_tokens 1024 (now 64)"),
    ],
)
def test_a_rerun_with_other_answer_settings_is_refused_not_mixed_in(
    recorded_runs, world, eval_cli, capsys, extra, said
):
    """A rerun into the same --out with another temperature or budget wrote the missing queries with those settings
    beside the first run's answers, in one converted file, with no word (the audit of 2026-12-01)."""
    out, _ = recorded_runs["CoT@1"]
    converted = (out / f"{GROUP}.json").read_text()
    assert _run(eval_cli, world, "http://127.0.0.1:9/v1", "CoT@1", out, *extra) == 2
    err = capsys.readouterr().err
    assert "holds an answer made with " + said in err and "use another --out" in err
    assert (out / f"{GROUP}.json").read_text() == converted


def test_a_server_whose_simulator_is_away_fails_the_queries_not_writes_them(
    world, eval_cli, virtual_server, tmp_path, capsys
):
    """The virtual server's simulator engine down: every miss answered `Failed to generate fake response (the
    simulator engine is unreachable)`, which the run took for the APIs' answers and wrote as finished queries (two
    of three "won"), and a rerun skipped them. The server marks such an answer (`x-mirrorapi-retry`); the query
    fails, is not written, and the exit status is 1, as for a server that is down."""
    url, _ = virtual_server(
        "http://127.0.0.1:9/v1", "no-engine", tools_folder=f"[{world['tools']}, {world['queries']}]"
    )
    out = tmp_path / "run"
    with serve_recorded_agent([world["answers"] / "virtual_chatgpt_cot"], free_port()) as (base_url, _):
        status = eval_cli("run_agent")(
            ["--queries", str(world["queries"]), "--server", url + "/virtual", "--base-url", base_url,
             "--model", "recorded-agent", "--out", str(out), "--tools", str(world["tools"]), "--no-progress"]
        )  # fmt: skip
    said = capsys.readouterr()
    failed = [line for line in (said.out + said.err).splitlines() if "failed:" in line]
    assert status == 1 and len(failed) == len(IDS)
    asked = [line for line in failed if "could not answer" in line and "engine is unreachable" in line]
    assert asked and len(asked) + sum("failed: not started" in line for line in failed) == len(IDS), failed
    assert not list((out / "answer" / GROUP).glob("*.json")) if (out / "answer" / GROUP).exists() else True


def test_failing_engine_is_reported_per_query_and_retried(world, eval_cli, faulty_judge, tmp_path, capsys):
    # The FAKE engine answers text without tool calls and fails (HTTP 503) on query 608 while `failing`.
    faulty_judge.fail_on, faulty_judge.failing = "gmhikaru", True
    out = tmp_path / "run"
    args = ("--single-chain-max-step", "2", "--timeout", "5")
    assert _run(eval_cli, world, faulty_judge.base_url, "CoT@1", out, *args) == 1
    err = capsys.readouterr()
    failed = [line for line in (err.out + err.err).splitlines() if "failed:" in line]
    assert len(failed) == 1 and failed[0].startswith(f"query {GROUP}/608 failed: agent engine")
    assert sorted(json.loads((out / f"{GROUP}.json").read_text())) == ["1073", "588"]
    faulty_judge.failing = False
    assert _run(eval_cli, world, faulty_judge.base_url, "CoT@1", out, *args) == 0
    assert sorted(json.loads((out / f"{GROUP}.json").read_text())) == sorted(IDS)


def test_only_a_request_past_the_context_ends_a_chain_other_400s_fail_the_query(
    world, eval_cli, faulty_judge, tmp_path, capsys
):
    """An engine's 400 that says the prompt is past the model's context ends that chain without a final answer, as
    in StableToolBench; any other 400 (vLLM started without --enable-auto-tool-choice: every request with `tools`)
    is a setup error: the query fails, is not written, and a rerun retries it (it was written as a finished
    unanswered query, a silent 0% that a rerun then skipped)."""
    faulty_judge.fail_on, faulty_judge.failing, faulty_judge.fail_status = "gmhikaru", True, 400
    args = ("--single-chain-max-step", "2", "--timeout", "5")
    faulty_judge.fail_message = (
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'  # vLLM's words
    )
    misconfigured = tmp_path / "misconfigured"
    assert _run(eval_cli, world, faulty_judge.base_url, "CoT@1", misconfigured, *args) == 1
    said = capsys.readouterr()
    assert "query G1_instruction/608 failed: agent engine" in said.out + said.err
    assert sorted(json.loads((misconfigured / f"{GROUP}.json").read_text())) == ["1073", "588"]
    faulty_judge.fail_message = (
        "This model's maximum context length is 2048 tokens. However, you requested 2311 tokens"  # vLLM's words
    )
    too_long = tmp_path / "too-long"
    assert _run(eval_cli, world, faulty_judge.base_url, "CoT@1", too_long, *args) == 0
    assert sorted(json.loads((too_long / f"{GROUP}.json").read_text())) == sorted(IDS)


def test_tiny_model_agent_ends_every_query(world, eval_cli, tiny_engine, tmp_path):
    """A model that never calls a tool: every chain ends at the depth budget, without a final answer."""
    out = tmp_path / "tiny"
    code = eval_cli("run_agent")(
        [
            "--queries",
            str(world["queries"]),
            "--server",
            world["server"],
            "--base-url",
            tiny_engine.base_url,
            "--model",
            tiny_engine.model,
            "--out",
            str(out),
            "--single-chain-max-step",
            "1",
            "--max-tokens",
            "8",
            "--no-progress",
        ]
    )
    assert code == 0
    converted = json.loads((out / f"{GROUP}.json").read_text())
    assert sorted(converted) == sorted(IDS)
    for qid in IDS:
        data = _raw(out, qid, "CoT@1")
        assert_stabletoolbench_converter_reads(data, "CoT@1")
        assert data["answer_generation"]["valid_data"] is False and converted[qid]["answer"]["final_answer"] == ""
        assert data["trys"][0]["chain"][-1]["pruned"] is True


def test_sowr_of_the_two_example_models(world, eval_cli, tiny_engine, tmp_path):
    converted = world["stb"] / "data_example" / "model_predictions_converted"
    ids = world["stb"] / "solvable_queries_example" / "test_query_ids"
    out = tmp_path / "sowr"
    code = eval_cli("sowr")(
        [
            "--reference",
            str(converted / "virtual_chatgpt_cot"),
            "--candidate",
            str(converted / "virtual_chatgpt_dfs"),
            "--ids",
            str(ids),
            "--base-url",
            tiny_engine.base_url,
            "--model",
            tiny_engine.model,
            "--out",
            str(out),
            "--rounds",
            "1",
            "--max-tokens",
            "8",
            "--no-progress",
        ]
    )
    assert code == 0
    table = json.loads((out / "sowr.json").read_text())
    assert table["reference"] == "virtual_chatgpt_cot" and table["complete"]
    (row,) = table["rows"]
    cell = row["groups"][GROUP]
    assert row["model"] == "virtual_chatgpt_dfs" and cell["ids"] == 3
    assert cell["wins"] + cell["ties"] + cell["losses"] == 3
    # CoT/588 has no final answer (Unsolved without a judge call): the reference cannot win 588.
    sopr = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert {r["judged"] for r in sopr if r["model"] == "virtual_chatgpt_cot" and r["query_id"] == "588"} == {False}
    markdown = (out / "sowr.md").read_text()
    assert "| Method | I1 Inst | Average |" in markdown and "| virtual_chatgpt_dfs |" in markdown


# ------------------------------------------------------------------------- the agent-react-v1 text protocol
@pytest.fixture(scope="module")
def react_runs(world, eval_cli):
    """CoT and DFS runs in the text protocol with the RECORDED agent replying in text (StableToolBench's
    trajectories rendered as Thought / Action / Action Input); {method: (out folder, request bodies)}."""
    runs = {}
    for method, folder in FOLDERS.items():
        with serve_recorded_agent([world["answers"] / folder], free_port(), text_protocol=True) as (base_url, agent):
            out = world["root"] / f"react-{method}"
            assert _run(eval_cli, world, base_url, method, out, "--prompt-format", "agent-react-v1") == 0
            runs[method] = (out, list(agent.bodies))
    return runs


def test_text_protocol_reproduces_the_recorded_runs(react_runs, world):
    for method, folder in FOLDERS.items():
        out, bodies = react_runs[method]
        converted = json.loads((out / f"{GROUP}.json").read_text())
        recorded = json.loads(
            (world["stb"] / "data_example" / "model_predictions_converted" / folder / f"{GROUP}.json").read_text()
        )
        assert sorted(converted) == sorted(IDS)
        for qid in IDS:
            data = _raw(out, qid, method)
            assert_stabletoolbench_converter_reads(data, method)
            assert data["agent_settings"]["prompt_format"] == "agent-react-v1"
            real = json.loads((world["answers"] / folder / GROUP / f"{qid}_{method}.json").read_text())
            assert data["answer_generation"]["final_answer"] == real["answer_generation"]["final_answer"]
            assert _tool_path(converted[qid]) == _tool_path(recorded[qid])
            # The answer file keeps StableToolBench's messages, not the text the model saw.
            if data["answer_generation"]["valid_data"]:
                conversation = data["answer_generation"]["train_messages"][-1]
                assert any(m.get("tool_calls") for m in conversation if m["role"] == "assistant")
                assert any(m["role"] == "tool" for m in conversation)
        # The engine got text only: no tools, no tool calls, results as "Observation:" user messages.
        assert bodies and all("tools" not in body and body["stop"] == ["\nObservation:"] for body in bodies)
        messages = [m for body in bodies for m in body["messages"]]
        assert all(m["role"] in ("system", "user", "assistant") and set(m) == {"role", "content"} for m in messages)
        assert any(m["role"] == "user" and m["content"].startswith("Observation: {") for m in messages)
        assert "Action Input:" in bodies[0]["messages"][0]["content"]
        function_names = {f["function"]["name"] for f in _raw(out, "608", method)["answer_generation"]["function"]}
        system_608 = next(b["messages"][0]["content"] for b in bodies if "gmhikaru" in b["messages"][1]["content"])
        assert all(f"\n{name}: " in system_608 for name in function_names - {"Finish"})
    # 588's recorded CoT run has no final answer; replayed in text it has none either.
    assert _raw(react_runs["CoT@1"][0], "588", "CoT@1")["answer_generation"]["valid_data"] is False


def test_a_run_in_another_prompt_format_is_not_mixed_in(react_runs, world, eval_cli, capsys):
    out, _ = react_runs["CoT@1"]
    (out / "answer" / GROUP / "608_CoT@1.json").rename(out / "608.kept")  # one query left to do: a resume
    try:
        assert _run(eval_cli, world, "http://127.0.0.1:9/v1", "CoT@1", out) == 2  # agent-v1 (the default)
        assert "in prompt format 'agent-react-v1', not 'agent-v1'" in capsys.readouterr().err
    finally:
        (out / "608.kept").rename(out / "answer" / GROUP / "608_CoT@1.json")


def test_text_protocol_unknown_function_gets_an_error_observation(world, eval_cli, faulty_judge, tmp_path):
    # The FAKE engine replies with the same text every time: a call of a function the query does not have.
    faulty_judge.reply = 'Thought: I will search the web.\nAction: google_search\nAction Input: {"q": "gmhikaru"}'
    out = tmp_path / "react-unknown"
    assert (
        _run(
            eval_cli,
            world,
            faulty_judge.base_url,
            "CoT@1",
            out,
            "--prompt-format",
            "agent-react-v1",
            "--single-chain-max-step",
            "4",
            "--limit",
            "1",
        )
        == 0
    )
    data = _raw(out, "588", "CoT@1")
    chain = data["trys"][0]["chain"]
    assert [n["node_type"] for n in chain] == ["Thought", "Action", "Action Input"] * 2
    assert all(
        n["observation_code"] == 1 and "No such function name: google_search" in n["observation"]
        for n in chain
        if n["node_type"] == "Action Input"
    )
    assert data["answer_generation"]["valid_data"] is False
    second = faulty_judge.received[-1]  # the second step (the first requests may be the runner's probes)
    assert second[-1] == {"role": "user", "content": f"Observation: {chain[2]['observation']}"}
    assert second[-2]["content"].startswith(
        "Thought: I will search the web.\nAction: invalid_hallucination_function_name\n"
    )


def test_react_grammar_names_the_query_functions(world, eval_cli, tmp_path):
    with serve_recorded_agent([world["answers"] / "virtual_chatgpt_cot"], free_port(), text_protocol=True) as (
        base_url,
        agent,
    ):
        assert (
            _run(
                eval_cli,
                world,
                base_url,
                "CoT@1",
                tmp_path / "grammar",
                "--prompt-format",
                "agent-react-v1",
                "--react-grammar",
                "--limit",
                "1",
            )
            == 0
        )
        grammars = {body["grammar"] for body in agent.bodies if "grammar" in body}
    (grammar,) = grammars  # one query, one grammar
    functions = [
        f["function"]["name"] for f in _raw(tmp_path / "grammar", "588", "CoT@1")["answer_generation"]["function"]
    ]
    action = next(line for line in grammar.splitlines() if line.startswith("action ::="))
    assert action == "action ::= " + " | ".join(f'"{name}"' for name in functions)  # Finish is the last one
    assert grammar.startswith('root ::= "Thought: " thought "\\nAction: " action "\\nAction Input: " object')
