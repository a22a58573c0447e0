"""`eval/simulator.py --history both` (issue 13): held-out episodes replayed with and without session
history, per-step fidelity and the consistency score."""

import json

from harness.fake_engines import TokenSessionEngine
from harness.processes import free_port
from mirrorapi.evaluation.fidelity.carried_values import EpisodeValues
from mirrorapi.evaluation.fidelity.metrics import compare
from mirrorapi.evaluation.fidelity.replay import load_pairs
from mirrorapi.evaluation.fidelity.session_history import (
    consistency,
    consistency_after_recorded_history,
    heldout_episodes,
    history_report,
    render_history_markdown,
    values,
)
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache
from mirrorapi.tools import ToolRegistry


def test_values_are_ids_tokens_and_names():
    # api-bank gen-00133: GetUserToken's answer, then AppointmentRegistration's (real pairs of data/samples)
    assert values('{"token": "o8i7u6y5t4r3e2w1q0"}') == {"o8i7u6y5t4r3e2w1q0"}
    assert values("56545338") == {"56545338"}
    assert values({"status": "success", "ok": True, "n": 3, "id": 17, "price": 4.5}) == {"17", "4.5"}
    # A simulator writing NaN (Python's json reads it) carries no value there, and the answer's others are kept.
    assert values({"price": float("nan"), "total": float("inf"), "id": "abc123"}) == {"abc123"}
    assert values('{"price": NaN, "id": "abc123"}') == {"abc123"}
    long = "Reservation ABC123 confirmed for flight HAT004 on 2024-05-16; the passenger was told"
    assert values(long) == {"ABC123", "HAT004", "2024-05-16"}


def test_real_answers_are_fully_consistent_and_empty_ones_not(samples):
    pairs = load_pairs([samples / "pairs.jsonl"])
    real = consistency(pairs, [p["response"] for p in pairs])
    assert real["steps"] > 10 and real["values_carried"] > real["steps"] and real["score"] == 100.0
    empty = consistency(pairs, [{"error": "", "response": ""} for _ in pairs])
    assert empty["score"] == 0.0 and empty["values_carried"] == real["values_carried"]


def test_history_is_compared_with_the_call_by_call_pass_on_the_same_calls(samples):
    """With history the simulator answers every call as the API did, without it none: with minus without is
    positive, and its interval too, on both measures (the difference's sign is the report's whole point)."""
    pairs = load_pairs([samples / "pairs.jsonl"])[:12]
    right = [p["response"] for p in pairs]
    wrong = [{"error": "", "response": "nothing like it"} for _ in pairs]
    passes = {"without": (wrong, compare(pairs, wrong)), "with": (right, compare(pairs, right))}
    for rows in (passes["without"][1], passes["with"][1]):
        for row in rows:
            row["from_cache"] = False
    gap = history_report(pairs, passes)["with_minus_without"]
    assert gap["rouge_l"]["ci95"][0] > 0 and gap["bleu4"]["ci95"][0] > 0
    assert gap["rouge_l"]["difference"] > 90


def test_the_nearest_example_is_scored_beside_both_passes_with_a_consistency_of_its_own():
    """A login's token and the user's name, both repeated by the episode's next answer: the session pass's
    simulator repeats its own token and the name (consistency 100), the call-by-call one only the name (50), and
    the nearest example, a training episode's answers, neither (0): its row is what a session has to beat (issue
    32). Worked out by hand from the definition: one step carries two values, "amy" from a request and the token
    from an answer ("09:00" is a request's value the answer does not repeat)."""
    call = {"source": "api-bank", "episode": "e1", "category": "Alarm", "tool_name": "alarm"}
    pairs = [
        call
        | {
            "step": 0,
            "api_name": "Login",
            "tool_input": {"username": "amy"},
            "response": {"error": "", "response": {"token": "tok111aa"}},
        },
        call
        | {
            "step": 1,
            "api_name": "AddAlarm",
            "tool_input": {"time": "09:00"},
            "response": {"error": "", "response": {"alarm": "alm777x", "owner": "tok111aa", "user": "amy"}},
        },
    ]
    with_history = [
        {"error": "", "response": {"token": "sim999zz"}},
        {"error": "", "response": {"alarm": "x1234", "owner": "sim999zz", "user": "amy"}},
    ]
    without = [with_history[0], {"error": "", "response": {"alarm": "x1234", "owner": "sim000qq", "user": "amy"}}]
    examples = [
        {"error": "", "response": {"token": "tok000bb"}},
        {"error": "", "response": {"alarm": "alm555", "owner": "tok222cc", "user": "bob"}},
    ]
    passes = {
        name: (answers, compare(pairs, answers, baseline=lambda pair: examples[pair["step"]]))
        for name, answers in (("without", without), ("with", with_history))
    }
    report = history_report(pairs, passes)
    one_step = {"steps": 1, "values_carried": 2}
    assert report["with"]["consistency"] == {"score": 100.0, **one_step, "values_repeated": 2}
    assert report["without"]["consistency"] == {"score": 50.0, **one_step, "values_repeated": 1}
    assert report["nearest_example"]["consistency"] == {"score": 0.0, **one_step, "values_repeated": 0}
    assert report["nearest_example"]["overall"]["n"] == 2
    markdown = render_history_markdown(report)
    assert "| nearest example | 0.0 | 1 | 2 | 0 |" in markdown and "| nearest example | all | 2 |" in markdown
    # A replay without a baseline (no training pairs given) has no such row.
    passes = {name: (answers, compare(pairs, answers)) for name, (answers, _) in passes.items()}
    assert "nearest_example" not in history_report(pairs, passes)


def test_offline_consistency_counts_the_recorded_values_an_answer_repeats():
    """An offline answer stage shows its session records the recorded history, so a value counts only where the
    answer writes that literal. By hand: the login's token and the user's name (from its request) are shown and the
    real answer repeats both (2 carried); an answer with the token and another name repeats 1; no answer (a missing
    nearest example) none; a first call (nothing shown) carries nothing."""
    login = {"tool_input": {"username": "amy"}, "response": {"error": "", "response": {"token": "tok111aa"}}}
    alarm = {
        "tool_input": {"time": "09:00"},
        "response": {"error": "", "response": {"alarm": "alm777x", "owner": "tok111aa", "user": "amy"}},
    }
    answer = {"error": "", "response": {"alarm": "a1", "owner": "tok111aa", "user": "bob"}}
    found = consistency_after_recorded_history(
        [[], [login], [login]], [login, alarm, alarm], [login["response"], answer, None]
    )
    assert found == {"score": 25.0, "steps": 2, "values_carried": 4, "values_repeated": 1}


def test_heldout_episodes_are_whole_and_follow_the_builder_split(samples):
    pairs = load_pairs([samples / "pairs.jsonl"])
    held = heldout_episodes(pairs, ToolRegistry.load([samples / "tools"]))
    episodes = {(p["source"], p["episode"]) for p in held}
    assert 0 < len(episodes) < len({(p["source"], p["episode"]) for p in pairs})
    assert held == [p for p in pairs if (p["source"], p["episode"]) in episodes]  # whole episodes, in order


def test_replay_with_and_without_history(eval_cli, virtual_server, samples, tmp_path):
    # A server that only replays recorded answers: both passes give the real answers, so every
    # figure of both is perfect and the sessions only change the path (X-Session-Id) taken.
    pairs = load_pairs([samples / "pairs.jsonl"])
    registry = ToolRegistry.load([samples / "tools"])
    calls: dict = {}
    for pair in pairs:
        calls.setdefault(
            (pair["category"], pair["tool_name"], pair["api_name"], canonical_json(pair["tool_input"])), []
        ).append(pair)
    by_episode: dict = {}
    for pair in pairs:
        by_episode.setdefault((pair["source"], pair["episode"]), []).append(pair)
    chosen = [
        e
        for e in by_episode.values()
        if len(e) > 1
        and consistency(e, [p["response"] for p in e])["steps"]
        and all(
            len(calls[(p["category"], p["tool_name"], p["api_name"], canonical_json(p["tool_input"]))]) == 1 for p in e
        )
    ][:3]
    held = [p for episode in chosen for p in episode]
    assert len(chosen) == 3
    cache = ResponseCache(tmp_path / "filled.sqlite")
    docs = [registry.resolve(p["category"], p["tool_name"], p["api_name"]) for p in held]
    cache.put_many(
        [
            (d.category, d.tool, d.api, p["tool_input"], p["response"]["error"], p["response"]["response"])
            for d, p in zip(docs, held, strict=True)
        ],
        "real",
    )
    cache.close()
    url, log = virtual_server(
        f"http://127.0.0.1:{free_port()}/v1",
        "unused",
        mode="replay",
        missing_required="simulate",
        cache_path=tmp_path / "filled.sqlite",
    )
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(p) + "\n" for p in held))
    out = tmp_path / "report"
    assert (
        eval_cli("simulator")(
            [
                "--pairs",
                str(heldout),
                "--server",
                url,
                "--out",
                str(out),
                "--history",
                "both",
                "--include-cache-hits",
                "--no-progress",
            ]
        )
        == 0
    )
    report = json.loads((out / "fidelity.json").read_text())["sessions"]
    assert report["episodes"] == 3 and report["calls"] == len(held)
    # Recorded answers are served in sessions too: every call of both passes was a hit, scored on request.
    assert report["cache_hits"] == report["scored"] == len(held)
    for name in ("without", "with"):
        assert report[name]["overall"]["rouge_l"] == 100.0 and report[name]["consistency"]["score"] == 100.0
        assert report[name]["per_step"]["0"]["n"] == 3
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum("session" in line for line in lines) == len(held)  # the second pass, one session per episode
    assert len({line["session"] for line in lines if "session" in line}) == 3
    # The same answers in both passes: history changes nothing, in any resample of the calls.
    assert report["with_minus_without"]["rouge_l"] == {"difference": 0.0, "ci95": [0.0, 0.0]}
    assert report["with_minus_without"]["bleu4"] == {"difference": 0.0, "ci95": [0.0, 0.0]}
    markdown = (out / "fidelity.md").read_text()
    assert "## With and without session history" in markdown
    assert "With history minus without, on the same calls" in markdown
    assert "ROUGE-L +0.0 [+0.0, +0.0], BLEU-4 +0.0 [+0.0, +0.0]." in markdown


def test_later_requests_carry_the_simulators_values_and_are_scored_with_the_real_names(samples):
    """api-bank gen-00133 (real pairs): the token GetUserToken gave goes to QueryBalance, the appointment id
    AppointmentRegistration gave to CancelRegistration. Replayed with the simulator's own token and id, the
    requests send those; an answer that repeats the simulator's id is scored with the real one; what the user gave
    (a patient's name) is never replaced, and the answer that first gave a value is scored as written."""
    login, balance, registration, cancel = sorted(
        (p for p in load_pairs([samples / "pairs.jsonl"]) if p["episode"] == "gen-00133"), key=lambda p: p["step"]
    )
    real_token = json.loads(login["response"]["response"])["token"]
    real_id = registration["response"]["response"]
    assert balance["tool_input"] == {"token": real_token} and cancel["tool_input"] == {"appointment_id": real_id}
    episode = EpisodeValues()
    sent = episode.request(login["tool_input"])
    assert sent == login["tool_input"]
    issued = {"error": "", "response": {"token": "simulated0token0001"}}
    episode.learn(login["response"]["response"], issued)
    assert episode.scored(issued) == issued  # the simulator's own token, as it wrote it
    assert episode.request(balance["tool_input"]) == {"token": "simulated0token0001"}
    assert episode.carried == [[real_token, "simulated0token0001"]]
    episode.learn(balance["response"]["response"], {"error": "", "response": "99.50"})
    # The token is the login's answer each time it is sent (api-bank gen-00074 sends one to three calls), never a
    # value the user gave: a second request with it carries it too.
    assert episode.request(balance["tool_input"]) == {"token": "simulated0token0001"}
    assert episode.carried == [[real_token, "simulated0token0001"]]
    assert episode.request(registration["tool_input"]) == registration["tool_input"]  # the user's names and date
    assert episode.carried == []
    episode.learn(registration["response"]["response"], {"error": "", "response": "12340000"})
    assert episode.request(cancel["tool_input"]) == {"appointment_id": "12340000"}
    echoed = {"error": "", "response": {"cancelled": "12340000", "note": "appointment 12340000 cancelled"}}
    assert episode.scored(echoed)["response"] == {"cancelled": real_id, "note": f"appointment {real_id} cancelled"}
    # What the user gave stays, even where an answer showed it and the simulator's showed another name there.
    episode.learn('{"patient_name": "John Smith"}', {"error": "", "response": {"patient_name": "Jane Doe"}})
    assert episode.request(registration["tool_input"]) == registration["tool_input"]


def test_a_value_the_simulators_answers_hold_is_sent_as_recorded(samples):
    """api-bank gen-01066 (real pairs): UserPosts gave post ids, LikeCount asks for one. A simulator that lists
    the same id at another place has it in its session: the request keeps it."""
    posts, likes = sorted(
        (p for p in load_pairs([samples / "pairs.jsonl"]) if p["episode"] == "gen-01066"), key=lambda p: p["step"]
    )[:2]
    real_ids = json.loads(posts["response"]["response"])["post_ids"]
    asked = likes["tool_input"]["post_id"]
    assert asked in real_ids
    others = [i + 1000 for i in real_ids]
    for listed, sent in ((others, others[real_ids.index(asked)]), ([asked, *others], asked)):
        episode = EpisodeValues()
        episode.request(posts["tool_input"])
        episode.learn(posts["response"]["response"], {"error": "", "response": {"post_ids": listed}})
        assert episode.request(likes["tool_input"]) == {**likes["tool_input"], "post_id": sent}


def test_a_session_replay_sends_the_token_the_simulator_gave(eval_cli, virtual_server, samples, tmp_path):
    """api-bank gen-00133's first two real calls: GetUserToken, then QueryBalance with the token the real API gave.
    A simulator that keeps its session consistent (a named stand-in: its own token, no other accepted) must refuse
    the real token when the episode is replayed as recorded, and that refusal is scored against the real success;
    with the values carried (the default), the request sends its token, as an agent reading its answers would."""
    login, balance = sorted(
        (p for p in load_pairs([samples / "pairs.jsonl"]) if p["episode"] == "gen-00133"), key=lambda p: p["step"]
    )[:2]
    again = {**balance, "step": balance["step"] + 1}  # the token sent a second time (as gen-00074 sends its three)
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(p) + "\n" for p in (login, balance, again)))
    with TokenSessionEngine(issued="simulated0token0001", accepted=balance["response"]["response"]) as engine:
        url, _ = virtual_server(engine.url, "stand-in")
        reports = {}
        for mode in ("recorded", None):
            out = tmp_path / str(mode)
            flags = ["--session-values", mode] if mode else []
            command = ["--pairs", str(heldout), "--server", url, "--out", str(out), "--history", "both", *flags]
            assert eval_cli("simulator")([*command, "--no-progress"]) == 0
            reports[mode] = json.loads((out / "fidelity.json").read_text())["sessions"]
            sent = json.loads(engine.requests[-1]["messages"][-1]["content"].rsplit("Request:\n", 1)[1])
            assert sent == ({"token": "simulated0token0001"} if mode is None else balance["tool_input"])
    recorded, carried = reports["recorded"]["with"], reports[None]["with"]
    assert recorded["per_step"]["1"]["error_agreement"] == 0.0  # refused: the real API answered
    for step in ("1", "2"):
        assert carried["per_step"][step]["error_agreement"] == 100.0 and carried["per_step"][step]["rouge_l"] == 100.0
    assert (recorded["requests_carrying_simulated_values"], carried["requests_carrying_simulated_values"]) == (0, 2)
    # Alone, no pass can know the token: refused in both runs.
    assert reports[None]["without"]["per_step"]["1"]["error_agreement"] == 0.0
    assert "2 of the scored requests sent a value" in (tmp_path / "None" / "fidelity.md").read_text()
    # Each pass's answers, call by call, to read what history changed: calls.jsonl alone, session_calls.jsonl in a
    # session, with what a request carried.
    alone, in_session = (
        [json.loads(line) for line in (tmp_path / "None" / name).read_text().splitlines()]
        for name in ("calls.jsonl", "session_calls.jsonl")
    )
    steps = [p["step"] for p in (login, balance, again)]
    assert [row["step"] for row in in_session] == [row["step"] for row in alone] == steps
    assert [row["simulated_error"] for row in alone[1:]] == [True, True]
    assert [row["simulated_error"] for row in in_session[1:]] == [False, False]
    real_token = json.loads(login["response"]["response"])["token"]
    assert in_session[1]["simulated_extra"]["carried_values"] == [[real_token, "simulated0token0001"]]
    assert in_session[1]["tool_input"] == balance["tool_input"]  # the row names the recorded request


def test_a_session_request_that_is_a_training_call_leaves_the_call_by_call_figures_alone(
    eval_cli, virtual_server, samples, tmp_path
):
    """`make demo`'s case (2026-11-30): in a session, a later request carries a value the simulator gave (there a
    reservation id it copied from its example; here its token), and a training call in the server's cache has those
    arguments, so the session pass gets a recorded answer. The history comparison leaves that call out of both its
    rows; the call-by-call figures keep it: their request was the recorded one, and the simulator answered it."""
    login, balance = sorted(
        (p for p in load_pairs([samples / "pairs.jsonl"]) if p["episode"] == "gen-00133"), key=lambda p: p["step"]
    )[:2]
    registry = ToolRegistry.load([samples / "tools"])
    doc = registry.resolve(balance["category"], balance["tool_name"], balance["api_name"])
    cache = ResponseCache(tmp_path / "training.sqlite")
    issued = "simulated0token0001"
    cache.put_many([(doc.category, doc.tool, doc.api, {"token": issued}, "", "1000.00")], "real")
    cache.close()
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(json.dumps(login) + "\n" + json.dumps(balance) + "\n")
    with TokenSessionEngine(issued=issued, accepted="unused: the cache answers") as engine:
        url, log = virtual_server(engine.url, "stand-in", cache_path=tmp_path / "training.sqlite")
        out = tmp_path / "report"
        command = ["--pairs", str(heldout), "--server", url, "--out", str(out), "--history", "both", "--no-progress"]
        assert eval_cli("simulator")(command) == 0
    served = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line.get("session") is not None, line["outcome"]) for line in served] == [
        (False, "simulated"),  # the login, alone
        (False, "simulated"),  # the balance with the real token: not a training call
        (True, "hit"),  # the login in its session: the stateless call, the simulator's own answer
        (True, "hit"),  # the balance with the simulator's token: the training call's recorded answer
    ]
    report = json.loads((out / "fidelity.json").read_text())
    assert (report["calls"], report["scored"], report["cache_hits"]["n"]) == (2, 2, 0)
    sessions = report["sessions"]
    assert (sessions["cache_hits"], sessions["scored"]) == (1, 1)
    assert sessions["without"]["overall"]["n"] == sessions["with"]["overall"]["n"] == 1
    rows = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    assert [row["from_cache"] for row in rows] == [False, False]
