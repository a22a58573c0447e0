"""scripts/train_shipped_models.py's answer stage with `--session-failure-rule related` gives a session call's answer
as a server with `session_failure_rule: related` does (tests/serving/test_session_failures.py): a failure after
earlier calls none of which is related to the call is the call's answer alone (its history twin's); a failure after
a related call, and every success, stay. With `alone`, every failure whose twin is no failure is the twin's answer."""

import json

from shipped_steps.answer import with_the_session_failure_rule

from mirrorapi.prompts.simulator_formats import history_line, shown_history, simulator_messages
from mirrorapi.records import canonical_json
from mirrorapi.tools import ToolRegistry

STOCK = ("apibank_finance", "QueryStock", {"stock_code": "NVDA", "date": "2023-03-02"}, "", "981.4")
LOGIN = ("apibank_account", "GetUserToken", {"username": "JaneSmith", "password": "secret"}, "", {"token": "t0k3n99"})
FAILURE = '{"error": "The username does not exist.", "response": ""}'
TOKEN = '{"error": "", "response": {"token": "t0k3n99"}}'


def record(doc, arguments: dict, fmt: str, step: int, history: list[str] | None = None) -> dict:
    """A held-out record as the data build writes it (the fields the answer stage reads)."""
    return {
        "split": "test_id",
        "source": "api-bank",
        "episode": "e",
        "step": step,
        "category": doc.category,
        "tool": doc.tool,
        "api": doc.api,
        "arguments": canonical_json(arguments),
        "prompt_format": fmt,
        "kind": "success",
        "prompt": simulator_messages(doc, arguments, [], fmt=fmt, history=history),
        "completion": [{"role": "assistant", "content": TOKEN}],
    }


def row(rec: dict, generated: str, twin: bool = False) -> dict:
    keys = ("split", "source", "episode", "step", "category", "tool", "api", "arguments", "prompt_format", "kind")
    return (
        {k: rec[k] for k in keys} | {"generated": generated, "cut": False} | ({"history_twin": True} if twin else {})
    )


def three_session_calls_and_their_twins(samples) -> tuple[list[dict], list[dict]]:
    """A login after a stock price only, a password change after the login that gave its token, the login again."""
    registry = ToolRegistry.load([samples / "tools"])
    login_doc = registry.resolve("APIBank", "apibank_account", "GetUserToken")
    modify_doc = registry.resolve("APIBank", "apibank_account", "ModifyPassword")
    modify = {"token": "t0k3n99", "old_password": "secret", "new_password": "n3w"}
    unrelated, related = [history_line(*STOCK)], [history_line(*LOGIN), history_line(*STOCK)]
    assert shown_history(simulator_messages(login_doc, LOGIN[2], [], fmt="mirrorapi-session-v2", history=related)) == (
        related
    )
    records = [
        record(login_doc, LOGIN[2], "mirrorapi-session-v2", 1, unrelated),  # a failure after a stock price only
        record(modify_doc, modify, "mirrorapi-session-v2", 2, related),  # after the login that gave its token
        record(login_doc, LOGIN[2], "mirrorapi-session-v2", 3, unrelated),  # a success stays as it is
    ]
    twins = []
    for r in records:  # the same calls' stateless records, as the data build writes them
        doc = registry.resolve(r["category"], r["tool"], r["api"])
        prompt = simulator_messages(doc, json.loads(r["arguments"]), [], fmt="mirrorapi-v2")
        twins.append({**r, "prompt_format": "mirrorapi-v2", "prompt": prompt, "history_twin": True})
    assert [shown_history(t["prompt"]) for t in twins] == [[], [], []]
    return records, twins


def test_a_session_failure_without_a_related_call_is_the_twin_s_answer(samples):
    records, twins = three_session_calls_and_their_twins(samples)
    answers = [FAILURE, FAILURE, TOKEN]
    rows = [row(r, a) for r, a in zip(records, answers, strict=True)] + [row(t, TOKEN, twin=True) for t in twins]
    out = with_the_session_failure_rule(rows, records + twins, "related")
    assert [r["generated"] for r in out[:3]] == [TOKEN, FAILURE, TOKEN]
    assert [r.get("asked_alone", False) for r in out] == [True, False, False, False, False, False]
    assert out[0]["session_generated"] == FAILURE and out[3:] == rows[3:]
    assert with_the_session_failure_rule(rows, records + twins, "any") == rows


def test_under_the_alone_rule_a_session_failure_stands_only_where_its_twin_fails_too(samples):
    records, twins = three_session_calls_and_their_twins(samples)
    other_failure = '{"error": "The token is incorrect.", "response": ""}'
    rows = [row(r, a) for r, a in zip(records, [FAILURE, FAILURE, TOKEN], strict=True)]
    rows += [row(t, a, twin=True) for t, a in zip(twins, [TOKEN, other_failure, TOKEN], strict=True)]
    out = with_the_session_failure_rule(rows, records + twins, "alone")
    # The first is the twin's answer; the second, after a related call, stands in its own words: its twin fails too.
    assert [r["generated"] for r in out[:3]] == [TOKEN, FAILURE, TOKEN]
    assert [r.get("asked_alone", False) for r in out[:3]] == [True, False, False]
    rows[4] = row(twins[1], TOKEN, twin=True)  # the second's twin a success: the second is checked too
    out = with_the_session_failure_rule(rows, records + twins, "alone")
    assert [r["generated"] for r in out[:3]] == [TOKEN, TOKEN, TOKEN]
    assert out[1]["session_generated"] == FAILURE
