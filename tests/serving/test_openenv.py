"""OpenEnv episodes (issue 34 §1): OpenEnv's own clients (openenv-core, in its venv: `make openenv-client`) drive
reset / step / state over the server's WebSocket `/ws` on 127.0.0.1, and plain HTTP takes OpenEnv's request shapes
at /reset, /step, /state. A step is answered exactly as /virtual answers the call in the episode's session."""

from __future__ import annotations

import json
import select
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.fake_engines import STUB_OBSERVATION

REPO = Path(__file__).resolve().parents[2]
CLIENT_PYTHON = REPO / ".venv-openenv" / "bin" / "python"
DRIVER = Path(__file__).with_name("openenv_driver.py")
TOOLSET = "tool=APIBank/apibank_account"
LOGIN = {"username": "JaneSmith", "password": "password"}  # a real API-Bank call of data/samples/pairs.jsonl
LOGIN_ANSWER = {"error": "", "response": '{"token": "o8i7u6y5t4r3e2w1q0"}'}
ACCOUNT_TOOLS = ["checktoken", "deleteaccount", "forgotpassword", "getusertoken", "modifypassword", "registeruser"]


@dataclass
class OpenEnvDriver:
    """openenv_driver.py, running in the client's venv: `drive` sends it a scenario and reads what came back."""

    process: subprocess.Popen
    log: Path

    def drive(self, url: str, scenario: str) -> dict:
        """Run a scenario with OpenEnv's client against the server at `url`; at most 120 s."""
        self.process.stdin.write(f"{url} {scenario}\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], 120)
        line = self.process.stdout.readline() if ready else ""
        assert line, f"no answer to {scenario} (exit {self.process.poll()}): {self.log.read_text()[-3000:]}"
        reply = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply["result"]


@pytest.fixture(scope="module")
def openenv_client(tmp_path_factory):
    """One driver process for this module's scenarios (importing OpenEnv's client takes ~6 s)."""
    assert CLIENT_PYTHON.is_file(), "OpenEnv's client is not installed: run `make openenv-client`"
    log = tmp_path_factory.mktemp("openenv") / "driver.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [str(CLIENT_PYTHON), str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    yield OpenEnvDriver(process, log)
    process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def virtual_body(arguments: dict) -> dict:
    return {
        "category": "APIBank",
        "tool_name": "apibank_account",
        "api_name": "GetUserToken",
        "tool_input": json.dumps(arguments),
    }


def test_openenvs_tool_client_drives_an_episode_answered_like_virtual(
    serve, recorded_cache, engine_down, openenv_client
):
    with serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as server:
        seen = openenv_client.drive(server.url, "tool_client")
        login = server.virtual(virtual_body(LOGIN)).json()
        refused = server.virtual(virtual_body({"username": "JaneSmith"})).json()
        hits = server.metric("mirrorapi_requests_total", outcome="hit")
    assert seen["reset_tools"] == seen["tools"] == ACCOUNT_TOOLS  # reset gives the toolset's tools
    assert seen["schema"] == {
        "type": "object",
        "required": ["username", "password"],
        "properties": {
            "username": {"type": "string", "description": "The username of the user."},
            "password": {"type": "string", "description": "The password of the user."},
        },
    }
    assert seen["login"] == login == LOGIN_ANSWER  # call_tool returns /virtual's observation
    assert seen["invalid"]["result"] == refused and refused["error"].startswith("Missing required parameter")
    assert seen["invalid"]["metadata"]["outcome"] == "validation_error" and seen["invalid"]["metadata"]["step"] == 2
    assert seen["invalid"]["reward"] is None and seen["invalid"]["done"] is False
    assert "Unknown tool 'no_such_tool'" in seen["unknown"] and "tool_not_found" in seen["unknown"]
    assert seen["state"] == {"episode_id": seen["reset_metadata"]["episode_id"], "step_count": 3}
    assert hits == 2  # the episode's call and /virtual's, both counted
    # MCPToolClient keeps only `tools` and `metadata` of a reset's observation: the toolset (and a task) are there
    assert seen["reset_metadata"]["toolset"] == TOOLSET and seen["reset_metadata"]["task"] is None


def test_an_episode_is_a_virtual_session_replayed_from_the_cache(serve, engine_stub, tmp_path, openenv_client):
    """Two misses in an episode are simulated in its session (the second after the first); /virtual with another
    session id replays them as hits, and a reset naming the same episode id starts its session over."""
    with serve(api_base=[engine_stub()], cache_path=str(tmp_path / "c.sqlite")) as server:
        first = openenv_client.drive(server.url, "generic_client")
        replay = [
            server.client.post("/virtual", json=virtual_body(arguments), headers={"x-session-id": "replay"})
            for arguments in ({"username": "new user", "password": "pw"}, {"username": "new user", "password": "pw2"})
        ]
        again = openenv_client.drive(server.url, "generic_client")
    assert first["reset"]["episode_id"] == "episode-7" and first["reset"]["task"] is None
    assert [t["name"] for t in first["reset"]["tools"]] == ACCOUNT_TOOLS
    assert [s["result"] for s in first["steps"]] == [STUB_OBSERVATION] * 2
    assert [s["metadata"]["cache"] for s in first["steps"]] == ["miss", "miss"]
    assert all(s["metadata"]["provenance"].startswith("simulated:") for s in first["steps"])
    assert [r.json() for r in replay] == [STUB_OBSERVATION] * 2  # the same calls, the same history: hits
    assert [r.json() for r in replay] == [s["result"] for s in first["steps"]]
    assert [s["metadata"]["cache"] for s in again["steps"]] == ["hit", "hit"]
    assert first["state"]["step_count"] == 2 and [c["arguments"]["password"] for c in first["state"]["calls"]] == [
        "pw",
        "pw2",
    ]
    assert first["state"]["calls"][0]["provenance"] == first["steps"][0]["metadata"]["provenance"]


def test_a_task_is_a_stabletoolbench_query(serve, engine_down, tmp_path, samples):
    """reset(task=query_id): the query's APIs are the toolset and its text is in the observation (HTTP here)."""
    query_file = tmp_path / "queries.json"
    query_file.write_text(
        json.dumps(
            [
                {
                    "query_id": 77,
                    "query": "Log me in as JaneSmith.",
                    "api_list": [
                        {"category_name": "APIBank", "tool_name": "apibank_account", "api_name": "GetUserToken"}
                    ],
                }
            ]
        )
    )
    with serve(
        api_base=[engine_down],
        cache_path=str(tmp_path / "c.sqlite"),
        tools_folder=[str(samples / "tools"), str(query_file)],
    ) as server:
        reset = server.client.post("/reset", json={"task": "77"}).json()["observation"]
        unknown = server.client.post("/reset", json={"task": "78"})
    assert reset["task"] == {"query_id": "77", "query": "Log me in as JaneSmith."}
    assert [t["name"] for t in reset["tools"]] == ["getusertoken"] and reset["toolset"] == "query=77"
    assert unknown.status_code == 422 and "unknown task '78'" in unknown.json()["detail"]


def test_the_documented_trl_environment_runs_an_episode(
    serve, recorded_cache, engine_down, tmp_path, samples, openenv_client
):
    query_file = tmp_path / "queries.json"
    query_file.write_text(
        json.dumps(
            [
                {
                    "query_id": 77,
                    "query": "Log me in as JaneSmith.",
                    "api_list": [
                        {"category_name": "APIBank", "tool_name": "apibank_account", "api_name": "GetUserToken"}
                    ],
                }
            ]
        )
    )
    with serve(
        api_base=[engine_down],
        cache_path=str(recorded_cache),
        engine_retries=0,
        tools_folder=[str(samples / "tools"), str(query_file)],
    ) as server:
        seen = openenv_client.drive(server.url, "documented_environment")
        failed = server.metric("mirrorapi_requests_total", outcome="engine_error")
    assert failed == 3  # the miss, sent three times by the documented class
    assert seen["prompt"].startswith("APIs: ") and json.loads(seen["prompt"][6:])[0]["name"] == "getusertoken"
    assert seen["answer"] == LOGIN_ANSWER
    assert "Unknown tool 'no_such_tool'" in seen["unknown"]
    assert seen["missed"].startswith("raised: ") and "EXECUTION_ERROR" in seen["missed"]
    assert "unreachable" in seen["missed"]


def test_http_reset_step_state_take_openenvs_request_shapes(serve, recorded_cache, engine_down):
    with serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as server:
        client = server.client
        reset = client.post("/reset", json={"toolset": TOOLSET, "seed": 3}).json()
        episode = reset["observation"]["episode_id"]
        step = client.post(
            "/step",
            json={
                "action": {"type": "call_tool", "tool_name": "getusertoken", "arguments": LOGIN},
                "episode_id": episode,
            },
        ).json()
        listed = client.post("/step", json={"action": {"type": "list_tools"}, "episode_id": episode}).json()
        state = client.get("/state", params={"episode_id": episode}).json()
        unknown = client.post("/step", json={"action": {"type": "list_tools"}, "episode_id": "nope"})
        wrong = client.post("/step", json={"action": {"type": "fly"}, "episode_id": episode})
        bad_toolset = client.post("/reset", json={"toolset": "category=NoSuchCategory"})
        method = client.get("/reset")
    assert reset["reward"] is None and reset["done"] is False
    assert step["observation"]["result"] == LOGIN_ANSWER and step["observation"]["error"] is None
    assert (
        step["observation"]["metadata"]["provenance"] == "real" and step["observation"]["metadata"]["cache"] == "hit"
    )
    assert [t["name"] for t in listed["observation"]["tools"]] == ACCOUNT_TOOLS
    assert state["step_count"] == 1 and state["calls"] == [
        {"tool_name": "getusertoken", "arguments": LOGIN, "error": "", "provenance": "real"}
    ]
    assert unknown.status_code == 404 and "unknown episode 'nope'" in unknown.json()["detail"]
    assert wrong.status_code == 422 and "unknown action type 'fly'" in wrong.json()["detail"]
    assert bad_toolset.status_code == 422 and "NoSuchCategory" in bad_toolset.json()["detail"]
    assert method.status_code == 405


def test_a_lookup_error_of_the_servers_own_is_not_an_unknown_episode(serve, recorded_cache, engine_down, monkeypatch):
    """Only an episode the server does not hold is a 404: a KeyError raised while a step is taken (a fault injected
    here, as no request provokes one) is the server's own, a 500 saying so, not "unknown episode" naming the key."""
    from mirrorapi.serving.openenv import Episodes

    async def broken_step(self, episode, action, client_gone=None):
        raise KeyError("calls")

    with serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as server:
        episode = server.client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        monkeypatch.setattr(Episodes, "step", broken_step)
        step = server.client.post("/step", json={"action": {"type": "list_tools"}, "episode_id": episode})
    assert step.status_code == 500 and "KeyError" in step.json()["detail"]


def test_open_episodes_are_bounded_and_the_api_key_holds_on_the_websocket(
    serve, engine_down, tmp_path, openenv_client
):
    with serve(api_base=[engine_down], cache_path=str(tmp_path / "c.sqlite"), max_episodes=2) as server:
        capacity = openenv_client.drive(server.url, "capacity")
    assert "Too many open episodes: 2 of 2" in capacity["refused"] and "CAPACITY_REACHED" in capacity["refused"]
    assert capacity["reopened"] == TOOLSET
    with serve(api_base=[engine_down], cache_path=str(tmp_path / "c.sqlite"), server_api_key="sesame") as server:
        refused = openenv_client.drive(server.url, "refused_without_key")
        metrics = httpx.get(server.url + "/metrics", headers={"authorization": "Bearer sesame"}).text
    assert refused["refused"] is not None and "403" in refused["refused"]
    assert 'mirrorapi_requests_total{outcome="unauthorized"} 1.0' in metrics


def test_the_example_drives_64_episodes_with_openenvs_client(serve, engine_stub, tmp_path):
    with serve(api_base=[engine_stub()], cache_path=str(tmp_path / "c.sqlite")) as server:
        assert CLIENT_PYTHON.is_file(), "OpenEnv's client is not installed: run `make openenv-client`"
        done = subprocess.run(
            [
                str(CLIENT_PYTHON),
                str(REPO / "scripts" / "openenv_episodes.py"),
                "--url",
                server.url,
                "--episodes",
                "64",
                "--steps",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["episodes"] == 64 and report["steps"] == 192
    assert sum(report["by_cache_and_answer"].values()) == 192


def test_websocket_messages_json_rpc_and_a_default_toolset_too_large(serve, recorded_cache, engine_down, monkeypatch):
    """With the `websockets` client: JSON-RPC at a /mcp WebSocket and as {"type": "mcp"} on /ws; a default toolset
    over the episode bound refuses a step before reset but not a reset naming a toolset; bad messages."""
    import asyncio

    from websockets.asyncio.client import connect

    from mirrorapi.serving import openenv

    monkeypatch.setattr(openenv, "MAX_EPISODE_TOOLS", 100)  # the sample's 262 APIs are then too many
    with (
        serve(
            api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0, mcp_toolset=TOOLSET
        ) as default_ok,
        serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as default_large,
    ):

        async def main() -> dict:
            seen = {}
            async with connect(default_ok.url.replace("http", "ws") + "/mcp") as ws:
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
                seen["listed"] = json.loads(await ws.recv())
                await ws.send(
                    json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": 2,
                            "method": "tools/call",
                            "params": {"name": "getusertoken", "arguments": LOGIN},
                        }
                    )
                )
                seen["called"] = json.loads(await ws.recv())
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "resources/list"}))
                seen["unknown_method"] = json.loads(await ws.recv())
            async with connect(default_large.url.replace("http", "ws") + "/ws") as ws:
                for message in (
                    {"type": "step", "data": {"type": "list_tools"}},
                    {"type": "reset", "data": {"toolset": TOOLSET}},
                    {
                        "type": "mcp",
                        "data": {
                            "jsonrpc": "2.0",
                            "id": 4,
                            "method": "tools/call",
                            "params": {"name": "getusertoken", "arguments": LOGIN},
                        },
                    },
                    {"type": "fly"},
                ):
                    await ws.send(json.dumps(message))
                    seen.setdefault("ws", []).append(json.loads(await ws.recv()))
                await ws.send("not json")
                seen["ws"].append(json.loads(await ws.recv()))
            return seen

        seen = asyncio.run(main())
    assert [t["name"] for t in seen["listed"]["result"]["tools"]] == ACCOUNT_TOOLS
    assert seen["listed"]["result"]["tools"][3]["inputSchema"]["required"] == ["username", "password"]
    assert seen["called"]["id"] == 2 and seen["called"]["result"]["isError"] is False
    assert json.loads(seen["called"]["result"]["content"][0]["text"]) == LOGIN_ANSWER
    assert seen["unknown_method"]["error"]["code"] == -32601
    too_large, reset, rpc, unknown, not_json = seen["ws"]
    assert too_large["type"] == "error" and "262 tools" in too_large["data"]["message"]
    assert (
        reset["type"] == "observation" and [t["name"] for t in reset["data"]["observation"]["tools"]] == ACCOUNT_TOOLS
    )
    assert rpc["type"] == "mcp" and json.loads(rpc["data"]["result"]["content"][0]["text"]) == LOGIN_ANSWER
    assert unknown["type"] == "error" and unknown["data"]["code"] == "UNKNOWN_TYPE"
    assert not_json["type"] == "error" and not_json["data"]["code"] == "INVALID_JSON"


def test_client_mistakes_and_store_failures_never_drop_a_websocket(serve, recorded_cache, engine_down, monkeypatch):
    """A lone surrogate (valid JSON "\\ud800", which a model may write) echoed back, JSON nested past the parser, and
    a store that fails are each answered, and the connection goes on; /mcp as a WebSocket takes its URL's toolset."""
    import asyncio

    from websockets.asyncio.client import connect

    from mirrorapi.serving import openenv
    from mirrorapi.serving.cache import CacheError

    monkeypatch.setattr(openenv, "MAX_EPISODE_TOOLS", 100)  # the default toolset (the sample's 262 APIs): too many
    deep = "[" * 100_000 + "]" * 100_000
    with serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as server:
        base = server.url.replace("http", "ws")

        async def main() -> dict:
            seen: dict = {}
            async with connect(base + "/ws") as ws:
                for text in (
                    json.dumps({"type": "reset", "data": {"toolset": TOOLSET}}),
                    '{"type": "step", "data": {"type": "call_tool", "tool_name": "\\ud800", "arguments": {}}}',
                    '{"type": "step", "data": {"type": "call_tool", "tool_name": "getusertoken", '
                    '"arguments": {"username": "\\ud800", "password": "x"}}}',
                    json.dumps({"type": "state"}),
                    deep,
                    json.dumps({"type": "reset", "data": {"toolset": TOOLSET, "episode_id": "e1"}}),
                ):
                    await ws.send(text)
                    seen.setdefault("ws", []).append(json.loads(await ws.recv()))
            async with connect(base + "/mcp?" + TOOLSET) as ws:
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
                seen["mcp"] = json.loads(await ws.recv())
            # Arguments nested as deep as a message can bring (the deepest the parser takes; the call refuses them
            # past 100 levels): `state` writes them deeper still, which once passed Python's recursion limit.
            async with connect(base + "/ws", max_size=None) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {"toolset": TOOLSET}}))
                await ws.recv()
                for depth in range(1000, 900, -1):
                    nested = "[" * depth + "]" * depth
                    await ws.send(
                        '{"type": "step", "data": {"type": "call_tool", "tool_name": "getusertoken", '
                        f'"arguments": {{"username": {nested}}}}}}}'
                    )
                    if json.loads(await ws.recv())["type"] == "observation":
                        break
                await ws.send(json.dumps({"type": "state"}))
                seen["deep_state"] = json.loads(await ws.recv())
            return seen

        cache = server.app.server.cache
        real = cache.update_session

        async def failing_store(session_id, *args, **kwargs):  # stands in for a store gone away, for episode e1
            if session_id == "e1":
                raise CacheError("the database is gone")
            return await real(session_id, *args, **kwargs)

        monkeypatch.setattr(cache, "update_session", failing_store)
        seen = asyncio.run(main())
    reset, unknown_tool, refused_arguments, state, too_deep, store_failed = seen["ws"]
    assert reset["type"] == "observation"
    assert unknown_tool["data"]["observation"]["error"]["error_type"] == "tool_not_found"
    assert unknown_tool["data"]["observation"]["tool_name"] == "\ud800"  # echoed as it came, as its JSON escape
    assert "lone surrogate" in refused_arguments["data"]["observation"]["result"]["error"]
    assert state["type"] == "state" and state["data"]["step_count"] == 2
    assert [c["tool_name"] for c in state["data"]["calls"]] == ["\ud800", "getusertoken"]
    assert too_deep["type"] == "error" and too_deep["data"]["code"] == "INVALID_JSON"
    assert store_failed["type"] == "error" and store_failed["data"]["code"] == "EXECUTION_ERROR"
    assert "the database is gone" in store_failed["data"]["message"]
    assert [t["name"] for t in seen["mcp"]["result"]["tools"]] == ACCOUNT_TOOLS
    assert seen["deep_state"]["type"] == "state", seen["deep_state"]
    assert (
        seen["deep_state"]["data"]["calls"][-1]["arguments"]
        == "(arguments nested more than 100 levels deep, not kept)"
    )


def test_http_episodes_keep_their_bound_under_concurrent_resets_and_end_when_idle(serve, recorded_cache, engine_down):
    import asyncio
    import time

    async def resets(url: str, count: int) -> list[int]:
        # Resets naming an episode start its session over in the store: they wait there, all at once.
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            replies = await asyncio.gather(
                *(client.post("/reset", json={"toolset": TOOLSET, "episode_id": f"e{i}"}) for i in range(count))
            )
        return [reply.status_code for reply in replies]

    settings = {"api_base": [engine_down], "cache_path": str(recorded_cache), "engine_retries": 0}
    with serve(**settings, max_episodes=3) as server:
        statuses = asyncio.run(resets(server.url, 20))
        assert sorted(statuses) == [200] * 3 + [503] * 17
        held = next(f"e{i}" for i, status in enumerate(statuses) if status == 200)
        again = server.client.post("/reset", json={"toolset": TOOLSET, "episode_id": held})  # keeps its place
        other = server.client.post("/reset", json={"toolset": TOOLSET, "episode_id": "another"})
        assert (again.status_code, other.status_code) == (200, 503)
    with serve(**settings, episode_idle_timeout=1) as server:
        client = server.client
        episode = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        step = {"type": "call_tool", "tool_name": "\ud800", "arguments": {}}
        body = json.dumps({"episode_id": episode, "action": step}).encode()  # the name as the escape "\ud800"
        stepped = client.post("/step", content=body, headers={"content-type": "application/json"})
        state = client.get("/state", params={"episode_id": episode})
        deep = client.post("/step", content=b"[" * 100_000 + b"]" * 100_000)
        surrogate_id = client.post(
            "/reset", content=b'{"episode_id": "\\ud800"}', headers={"content-type": "application/json"}
        )
        time.sleep(1.5)
        idle = client.post("/step", json={"episode_id": episode, "action": {"type": "list_tools"}})
    assert stepped.status_code == 200 and stepped.json()["observation"]["error"]["error_type"] == "tool_not_found"
    assert state.status_code == 200 and state.json()["calls"][0]["tool_name"] == "\ud800"
    assert deep.status_code == 422 and "nested too deep" in deep.json()["detail"]
    assert surrogate_id.status_code == 422 and "lone surrogate" in surrogate_id.json()["detail"]
    assert idle.status_code == 404 and "idle for more than 1 s" in idle.json()["detail"]


def test_an_episode_id_names_one_live_episode(serve, engine_stub, tmp_path):
    """Two rollouts reset under one id (a GRPO group named after its prompt, a timed-out rollout restarted) shared
    one simulator session: each was answered with the other's calls in its history, and neither's `state` showed
    it. The second reset is refused while the first episode lives (a WebSocket's, or an HTTP one: 409), and the
    id is free again once that episode's socket has closed."""
    import asyncio

    from websockets.asyncio.client import connect

    with serve(api_base=[engine_stub()], cache_path=str(tmp_path / "c.sqlite")) as server:
        base = server.url.replace("http", "ws")
        reset = json.dumps({"type": "reset", "data": {"toolset": TOOLSET, "episode_id": "q-42"}})

        async def main() -> tuple:
            async with connect(base + "/ws") as first:
                await first.send(reset)
                opened = json.loads(await first.recv())
                async with connect(base + "/ws") as second:
                    await second.send(reset)
                    refused = json.loads(await second.recv())
                over_http = await asyncio.to_thread(
                    server.client.post, "/reset", json={"toolset": TOOLSET, "episode_id": "q-42"}
                )
                await first.send(reset)  # its own id, again: it starts over
                again = json.loads(await first.recv())
            async with connect(base + "/ws") as third:  # the first has closed: the id is free
                await third.send(reset)
                later = json.loads(await third.recv())
            return opened, refused, over_http, again, later

        opened, refused, over_http, again, later = asyncio.run(main())
    assert opened["type"] == again["type"] == later["type"] == "observation"
    assert refused["type"] == "error" and "another live episode" in refused["data"]["message"]
    assert over_http.status_code == 409 and "another live episode" in over_http.json()["detail"]


def test_http_steps_of_one_episode_are_answered_one_at_a_time(serve, tmp_path):
    """Two steps of one HTTP episode sent at once were each simulated without the other in its history, while the
    session then held both: the same actions replayed in order missed the cache. One at a time, as OpenEnv steps an
    environment, the second is asked after the first. A stand-in engine records what each call was shown."""
    import concurrent.futures
    import time as clock

    from harness.fake_engines import FixedReplyEngine

    class Slow(FixedReplyEngine):
        def chat(self, request):
            clock.sleep(0.5)
            return super().chat(request)

    calls = [{"username": f"user{i}", "password": "pw"} for i in range(2)]
    with (
        Slow('{"error": "", "response": {"token": "t"}}') as engine,
        serve(api_base=[engine.url], cache_path=str(tmp_path / "c.sqlite")) as server,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        episode = server.client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]

        def step(arguments: dict) -> int:
            action = {"type": "call_tool", "tool_name": "getusertoken", "arguments": arguments}
            return server.client.post("/step", json={"action": action, "episode_id": episode}).status_code

        assert list(pool.map(step, calls)) == [200, 200]
    asked = [r["messages"][-1]["content"] for r in engine.requests if r["messages"][0]["role"] == "system"]
    assert len(asked) == 2 and sum("Earlier calls in this session" in prompt for prompt in asked) == 1


def test_http_episodes_keep_state_bounded_metadata_and_their_413s_close(serve, recorded_cache, engine_stub):
    """What `state` keeps of a call is bounded (a megabyte of arguments each gave a state reply past OpenEnv's
    client limit); a GET /state is a request that keeps its episode; a body too large is answered as /virtual
    answers it (the connection closes: the rest of the body is not read as a next request) and counted."""
    import time as clock

    with serve(api_base=[engine_stub()], cache_path=str(recorded_cache), episode_idle_timeout=1.0) as server:
        client = server.client
        episode = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        big = {"username": "x" * 10_000, "password": "pw"}
        action = {"type": "call_tool", "tool_name": "getusertoken", "arguments": big}
        assert client.post("/step", json={"action": action, "episode_id": episode}).status_code == 200
        for _ in range(3):  # 1.8 s of state requests alone, each within the idle timeout of the one before
            clock.sleep(0.6)
            state = client.get("/state", params={"episode_id": episode})
            assert state.status_code == 200
        with httpx.Client(base_url=server.url, timeout=30) as other:
            too_large = other.post("/step", content=b"{" + b" " * 2_000_000 + b"}")
        refused = server.metric("mirrorapi_requests_total", outcome="body_too_large")
    [call] = state.json()["calls"]
    assert call["arguments"] == f"(arguments of {len(json.dumps(big)):,} characters of JSON, not kept)"
    assert call["error"] == STUB_OBSERVATION["error"] and call["provenance"].startswith("simulated")
    assert too_large.status_code == 413 and too_large.headers["connection"] == "close" and refused == 1


def test_a_step_s_unknown_tool_name_is_kept_cut_or_by_its_type(serve, recorded_cache, engine_down):
    """OpenEnv's CallToolAction.tool_name is a string; a step's unknown name of any JSON value up to the body limit was
    kept whole in `state` and echoed whole (a megabyte's list of lists held ~23 MB of the episode's memory a step,
    256 steps an episode). A name is kept and echoed cut to STATE_NAME_CHARS, anything else by its type."""
    from mirrorapi.serving.openenv import STATE_NAME_CHARS

    with serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as server:
        client = server.client
        episode = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        echoed = []
        for name in ("n" * 100_000, [[]] * 50_000):
            action = {"type": "call_tool", "tool_name": name, "arguments": {}}
            stepped = client.post("/step", json={"action": action, "episode_id": episode})
            assert stepped.status_code == 200
            assert stepped.json()["observation"]["error"]["error_type"] == "tool_not_found"
            echoed.append(stepped.json()["observation"]["tool_name"])
        calls = client.get("/state", params={"episode_id": episode}).json()["calls"]
    assert echoed == ["n" * STATE_NAME_CHARS, "(list, not a name)"]
    assert [call["tool_name"] for call in calls] == echoed


def test_an_http_step_its_client_gave_up_on_enters_the_episode_once_when_sent_again(serve, tmp_path):
    """A trainer's HTTP step timed out and was sent again: the abandoned one was counted in the episode (`state` listed
    the call twice) and its session (the retry was simulated with its own abandoned copy in its history, and every
    later call too), where /virtual's session leaves a call out whose client has gone. Now a step whose client has
    closed its connection is answered (and stored) but not taken: the retry is the cache's answer to the same
    history, and the episode and session hold the call once. A stand-in engine records what each call was shown."""
    import time as clock

    from harness.fake_engines import FixedReplyEngine

    class Slow(FixedReplyEngine):
        def chat(self, request):
            if request["messages"][-1]["content"].count('"user1"') == 1 and not self.slowed:
                self.slowed = True
                clock.sleep(1.0)  # the first ask of user1's call: its client gives up first
            return super().chat(request)

        slowed = False

    def action(i: int) -> dict:
        return {
            "type": "call_tool",
            "tool_name": "getusertoken",
            "arguments": {"username": f"user{i}", "password": "p"},
        }

    with (
        Slow('{"error": "", "response": {"token": "t"}}') as engine,
        serve(api_base=[engine.url], cache_path=str(tmp_path / "c.sqlite")) as server,
    ):
        client = server.client
        episode = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        assert client.post("/step", json={"episode_id": episode, "action": action(0)}).status_code == 200
        with httpx.Client(base_url=server.url, timeout=0.3) as impatient, pytest.raises(httpx.ReadTimeout):
            impatient.post("/step", json={"episode_id": episode, "action": action(1)})
        again = client.post("/step", json={"episode_id": episode, "action": action(1)})
        last = client.post("/step", json={"episode_id": episode, "action": action(2)})
        state = client.get("/state", params={"episode_id": episode}).json()
    assert again.status_code == 200 and again.json()["observation"]["metadata"]["cache"] == "hit"
    assert again.json()["observation"]["metadata"]["step"] == 2 and last.json()["observation"]["metadata"]["step"] == 3
    assert state["step_count"] == 3
    assert [call["arguments"]["username"] for call in state["calls"]] == ["user0", "user1", "user2"]
    asked = [r["messages"][-1]["content"] for r in engine.requests if r["messages"][0]["role"] == "system"]
    assert len(asked) == 3  # user0, user1 (once: the retry is a hit), user2
    assert asked[-1].count('"user1"') == 1 and asked[-1].count('"user0"') == 1


def test_a_step_the_engine_fails_for_a_passing_cause_is_an_error_to_retry_not_the_api_s_answer(
    serve, recorded_cache, engine_down
):
    """An engine busy, away or slow gave the step an observation `{"error": "Failed to generate fake response ..."}`
    like an API's failure, counted in the episode (a trainer scored a rollout on the server's load, and a quiet rerun
    answered otherwise). Now it is OpenEnv's EXECUTION_ERROR on /ws and 503 with Retry-After over HTTP, and the
    episode is as it was; MCP's tools/call answers it as MCP does (isError), /virtual as StableToolBench's servers."""
    import asyncio

    from websockets.asyncio.client import connect

    call = {"type": "call_tool", "tool_name": "getusertoken", "arguments": {"username": "nobody", "password": "p"}}
    with serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as server:
        client = server.client
        episode = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        over_http = client.post("/step", json={"episode_id": episode, "action": call})
        state = client.get("/state", params={"episode_id": episode}).json()
        recorded = client.post("/step", json={"episode_id": episode, "action": {**call, "arguments": LOGIN}})

        async def main() -> list:
            async with connect(server.url.replace("http", "ws") + "/ws") as ws:
                replies = []
                for message in (
                    {"type": "reset", "data": {"toolset": TOOLSET}},
                    {"type": "step", "data": call},
                    {
                        "type": "mcp",
                        "data": {
                            "jsonrpc": "2.0",
                            "id": 1,
                            "method": "tools/call",
                            "params": {"name": "getusertoken", "arguments": call["arguments"]},
                        },
                    },
                    {"type": "state"},
                ):
                    await ws.send(json.dumps(message))
                    replies.append(json.loads(await ws.recv()))
                return replies

        _, on_ws, over_mcp, ws_state = asyncio.run(main())
        virtual = client.post("/virtual", json={**virtual_body(call["arguments"])})
    assert over_http.status_code == 503 and over_http.headers["retry-after"] == "1"
    assert "unreachable" in over_http.json()["detail"] and "send it again" in over_http.json()["detail"]
    assert state["step_count"] == 0 and state["calls"] == []
    assert recorded.status_code == 200 and json.loads(recorded.json()["observation"]["result"]["response"]) == {
        "token": "o8i7u6y5t4r3e2w1q0"
    }
    assert on_ws["type"] == "error" and on_ws["data"]["code"] == "EXECUTION_ERROR"
    assert over_mcp["type"] == "mcp" and over_mcp["data"]["result"]["isError"] is True
    assert ws_state["data"]["step_count"] == 1  # the tools/call, answered as MCP answers it
    assert virtual.status_code == 200 and virtual.json()["error"].startswith("Failed to generate fake response")


def test_an_http_episode_can_be_closed_and_its_place_taken(serve, recorded_cache, engine_down):
    """HTTP episodes had no close: an abandoned one held its place for `episode_idle_timeout` (15 minutes), so a
    trainer opening fresh ids over HTTP was capped at max_episodes per timeout, and the refusal told it to close one.
    POST /close ends one (after its step being answered) and frees its place."""
    with serve(api_base=[engine_down], cache_path=str(recorded_cache), max_episodes=1) as server:
        client = server.client
        first = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        step = {"type": "call_tool", "tool_name": "getusertoken", "arguments": LOGIN}
        assert client.post("/step", json={"episode_id": first, "action": step}).status_code == 200
        full = client.post("/reset", json={"toolset": TOOLSET})
        closed = client.post("/close", json={"episode_id": first})
        gone = client.post("/step", json={"episode_id": first, "action": step})
        second = client.post("/reset", json={"toolset": TOOLSET})
        unknown = client.post("/close", json={"episode_id": "never-opened"})
        wrong_method = client.get("/close")
    assert full.status_code == 503 and "POST /close" in full.json()["detail"]
    assert closed.status_code == 200 and closed.json() == {"episode_id": first, "step_count": 1}
    assert gone.status_code == 404 and second.status_code == 200
    assert unknown.status_code == 404 and wrong_method.status_code == 405


def test_state_writes_a_call_s_nan_as_strict_json_can_read_it(serve, recorded_cache, engine_down):
    """Arguments holding NaN or Infinity (Python's JSON reads them, as /virtual takes them) came back in `state` as
    bare NaN, which RFC 8259 has not: a strict client could not parse the reply. They are kept as strings."""
    with serve(api_base=[engine_down], cache_path=str(recorded_cache), engine_retries=0) as server:
        client = server.client
        episode = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        arguments = '{"token": NaN, "limits": [Infinity, -Infinity, 1.5]}'  # Python's json writes them so too
        action = f'{{"type": "call_tool", "tool_name": "x", "arguments": {arguments}}}'
        body = f'{{"episode_id": "{episode}", "action": {action}}}'
        stepped = client.post("/step", content=body, headers={"content-type": "application/json"})
        text = client.get("/state", params={"episode_id": episode}).text

    def refuse(constant: str):
        raise ValueError(f"not JSON (RFC 8259): {constant}")

    assert stepped.status_code == 200
    [call] = json.loads(text, parse_constant=refuse)["calls"]
    assert call["arguments"] == {"token": "NaN", "limits": ["Infinity", "-Infinity", 1.5]}


def test_large_steps_are_parsed_off_the_event_loop_and_answered_as_small_ones(serve, tmp_path, engine_stub):
    """A step of LARGE_BODY_BYTES or more is parsed in the server's worker process, as /virtual's bodies are (over
    HTTP and /ws it held the event loop: a tiny request waited 200 ms and 520 ms behind eight clients' megabyte steps,
    against 2.5 ms: bench/large_bodies.py). Answered as a small one: simulated, its arguments named
    by size in `state`, refused by the same bound as /virtual's when too large to simulate, and not JSON a 422."""
    import asyncio

    from websockets.asyncio.client import connect

    from mirrorapi.serving.arguments import LARGE_BODY_BYTES
    from mirrorapi.serving.handler import LargeBodies

    large = {"username": "u" * LARGE_BODY_BYTES, "password": "p"}
    huge = {"username": "u" * 300_000, "password": "p"}  # over max_arguments_chars (below): only a hit could answer
    with serve(api_base=[engine_stub()], cache_path=str(tmp_path / "c.sqlite"), max_arguments_chars=200_000) as server:
        client = server.client
        assert LargeBodies._ready.wait(120)  # its worker has started: until then a body under 1 MiB is parsed inline
        episode = client.post("/reset", json={"toolset": TOOLSET}).json()["observation"]["episode_id"]
        replies = [
            client.post(
                "/step",
                json={
                    "episode_id": episode,
                    "action": {"type": "call_tool", "tool_name": "getusertoken", "arguments": a},
                },
            )
            for a in (large, huge)
        ]
        not_json = client.post("/step", content=b'{"episode_id": "' + b"x" * LARGE_BODY_BYTES + b'"')
        state = client.get("/state", params={"episode_id": episode}).json()

        async def over_ws() -> dict:
            async with connect(server.url.replace("http", "ws") + "/ws", max_size=None) as ws:
                action = {"type": "call_tool", "tool_name": "getusertoken", "arguments": large}
                await ws.send(json.dumps({"type": "step", "data": action}))
                return json.loads(await ws.recv())

        on_ws = asyncio.run(over_ws())
        virtual = client.post("/virtual", json=virtual_body(huge))
    simulated, refused = (reply.json()["observation"] for reply in replies)
    assert simulated["result"] == STUB_OBSERVATION and simulated["metadata"]["outcome"] == "simulated"
    assert refused["metadata"]["outcome"] == "validation_error"
    assert refused["result"]["error"] == virtual.json()["error"] and "too large to simulate" in virtual.json()["error"]
    assert not_json.status_code == 422 and "not JSON" in not_json.json()["detail"]
    assert [call["arguments"] for call in state["calls"]] == [
        f"(arguments of {len(json.dumps(a)):,} characters of JSON, not kept)" for a in (large, huge)
    ]
    assert on_ws["type"] == "observation" and on_ws["data"]["observation"]["result"] == STUB_OBSERVATION
