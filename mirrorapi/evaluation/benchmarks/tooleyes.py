"""ToolEyes' five capability scores on the trajectories `eval/run_agent.py` writes (converted answers).

ToolEyes (Ye et al., arXiv 2401.00741; github Junjie-Ye/ToolEyes, read at commit
c818fcebe017951570a25e552a7984e40093fd52, `Code/Evaluation/util/utils.py`) scores a tool-use trajectory on:
- s_FA, format alignment (its `IF`): the share of the model's turns in the required format (a thought, an
  action and an Action Input that parses), the final answer turn included;
- s_IC, intent comprehension: the judge's "thought focus" (0-10) / 10;
- s_BP, behaviour planning: judged validity / 10 x judged quality / 10;
- s_TS, tool selection: tool reality x mean judged action-thought match / 10, where tool reality =
  1 - (hallucinated tools + calls with a parameter problem) / well-formatted calls; a parameter problem is a
  missing required parameter or a parameter the doc does not list (at most one per call);
- s_AO, answer organisation: judged relevance of the final answer / 10;
overall = the mean of the five. Scores are per trajectory, averaged per scenario and overall, in %.

Rule-based here by rule: s_FA and tool reality. Our trajectories are function calls (StableToolBench's converted
answers: the tool calls of the chosen path, `Finish` last), not ReAct text, so a turn is well formatted when it
names a function and its arguments are a JSON object; the `Finish` turn is the final answer turn (ToolEyes
checks only its format, as here) and is not a tool call for tool reality. ToolEyes stops checking parameters
after the first hallucinated tool of a trajectory (it tests the running count); we check each call's own.
Judged by the project's open judge (prompt `tooleyes-v1`): one call per trajectory giving the five 0-10 ratings
(ToolEyes asks GPT-4 per turn for the action-thought match; one mean rating per trajectory here). A rating the
judge's answer does not give counts 0, as in ToolEyes (`model_eval` scores an unreadable rating 0), so the
trajectory stays in its scenario's mean; a trajectory whose judge call failed (the engine, not the judge) is left
out of the judged means and counted apart, to be judged by a rerun.
A scenario is the query group (StableToolBench's G1_instruction, ...), in place of ToolEyes' seven scenarios.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorapi.command_line import add_settings_arguments, settings_from_args
from mirrorapi.engine_client import EngineClient, EngineError
from mirrorapi.evaluation.answers.items import AnswersError, group_order, load_answers, render_steps
from mirrorapi.evaluation.judge.scoring import JudgeSettings
from mirrorapi.prompts.judge_formats import (
    TOOLEYES_RATINGS,
    extract_final_answer,
    parse_tooleyes_ratings,
    tooleyes_messages,
)

CAPABILITIES = ("s_FA", "s_IC", "s_BP", "s_TS", "s_AO")
FINISH = "Finish"
TOOLEYES_MAX_TOKENS = 64  # a verdict is five short lines; the judge's general default (256) lets a CPU judge ramble


@dataclass
class Trajectory:
    model: str
    group: str
    query_id: str
    query: str
    steps: list[dict]  # {"name", "arguments"} of each call on the chosen path, Finish included
    tools: dict[str, dict]  # function name -> its parameters schema (available_tools)
    final_answer: str
    details: Any = None


def _path(answer_details: Any) -> list[dict]:
    nodes = answer_details if isinstance(answer_details, list) else [answer_details]
    node = nodes[0] if nodes and isinstance(nodes[0], dict) else None
    steps = []
    while node is not None:
        message = node.get("message")
        if node.get("role") == "tool" and isinstance(message, dict):
            steps.append({"name": message.get("name"), "arguments": message.get("arguments")})
        children = node.get("next")
        node = children[0] if isinstance(children, list) and children and isinstance(children[0], dict) else None
    return steps


def load_trajectories(answers: str | Path) -> list[Trajectory]:
    """Every trajectory of converted answers (`<model>/<group>.json`, eval/run_agent.py's --out)."""
    out = []
    for model, groups in load_answers(answers).items():
        for group in group_order(groups):
            for qid, record in groups[group].items():
                answer = record.get("answer") if isinstance(record.get("answer"), dict) else {}
                # StableToolBench's converted files list plain functions; ours, OpenAI's {"type", "function"}.
                functions = [t.get("function", t) for t in record.get("available_tools") or [] if isinstance(t, dict)]
                tools = {str(f.get("name")): _parameters(f, group, qid) for f in functions if isinstance(f, dict)}
                _, final = extract_final_answer(answer.get("final_answer"))
                out.append(
                    Trajectory(
                        model,
                        group,
                        qid,
                        str(record.get("query") or ""),
                        _path(answer.get("answer_details")),
                        tools,
                        final,
                        answer.get("answer_details"),
                    )
                )
    return out


def _parameters(function: dict, group: str, qid: str) -> dict:
    """A listed function's JSON-schema parameters (an object whose `properties` and `required`, if given, are an
    object and a list); AnswersError for another shape, a file this command cannot score."""
    schema = function.get("parameters") or {}
    if (
        not isinstance(schema, dict)
        or not isinstance(schema.get("properties") or {}, dict)
        or not isinstance(schema.get("required") or [], list)
    ):
        raise AnswersError(
            f"{group}: query {qid}: tool {function.get('name')!r} has no parameters object (a JSON schema with "
            "`properties` an object and `required` a list)"
        )
    return schema


# ------------------------------------------------------------------------------- rule-based parts
def arguments_object(arguments: Any) -> dict | None:
    """The call's arguments as a dict (ToolEyes: an Action Input that evaluates); None when malformed (an empty
    Action Input too: ToolEyes' `json_format_check` evaluates it, and `eval('')` fails)."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return None
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def well_formatted(step: dict) -> bool:
    return (
        isinstance(step.get("name"), str)
        and bool(step["name"].strip())
        and arguments_object(step.get("arguments")) is not None
    )


def format_alignment(trajectory: Trajectory) -> float:
    """s_FA: well-formatted turns / turns. A trajectory that never reached `Finish` (stopped at its depth limit)
    has one turn more, ill-formatted: ToolEyes' runner ends such a conversation with a forced "I cannot handle the
    task." turn (`Code/Inference/inference.py`), which its `Format_alignment_score` counts as a format error."""
    steps = trajectory.steps
    forced = not any(s.get("name") == FINISH for s in steps)
    turns = len(steps) + forced
    return sum(well_formatted(s) for s in steps) / turns


def parameter_problem(schema: dict, arguments: dict) -> bool:
    """A required parameter missing, or one the doc does not list."""
    properties = set((schema.get("properties") or {}).keys())
    required = set(schema.get("required") or [])
    return bool(required - set(arguments)) or any(k not in properties for k in arguments)


def tool_reality(trajectory: Trajectory) -> float:
    """1 - (hallucinated tools + calls with a parameter problem) / well-formatted calls (0 without any)."""
    calls = [s for s in trajectory.steps if well_formatted(s) and s["name"] != FINISH]
    if not calls:
        return 0.0
    problems = 0
    for call in calls:
        if call["name"] not in trajectory.tools:
            problems += 1
        elif parameter_problem(trajectory.tools[call["name"]], arguments_object(call["arguments"]) or {}):
            problems += 1
    return 1.0 - problems / len(calls)


def capability_scores(trajectory: Trajectory, ratings: dict[str, float] | None) -> dict:
    """The five scores in [0, 1] (None for the judged ones without `ratings`), with tool reality."""
    reality = tool_reality(trajectory)
    scores: dict[str, float | None] = {"s_FA": format_alignment(trajectory), "tool_reality": reality}
    if ratings is None:
        scores.update({"s_IC": None, "s_BP": None, "s_TS": None, "s_AO": None, "overall": None})
        return scores
    scores["s_IC"] = ratings["focus"] / 10
    scores["s_BP"] = ratings["validity"] / 10 * ratings["quality"] / 10
    scores["s_TS"] = reality * ratings["selection"] / 10
    scores["s_AO"] = ratings["relevance"] / 10
    scores["overall"] = statistics.fmean(scores[c] or 0.0 for c in CAPABILITIES)  # each set just above
    return scores


# ------------------------------------------------------------------------------- judged parts
async def _rate_all(trajectories: list[Trajectory], judge: JudgeSettings) -> list[dict | None]:
    """Each trajectory's ratings as its judge answer gives them (possibly not all five), or None where the judge
    call failed."""
    engine = EngineClient(judge.base_urls, judge.model, api_key=judge.api_key, timeout=judge.timeout)
    gate = asyncio.Semaphore(judge.concurrency or 4)

    async def rate(t: Trajectory) -> dict | None:
        messages = tooleyes_messages(t.query, render_steps(t.details), t.final_answer)
        async with gate:
            try:
                text = await engine.chat(messages, temperature=judge.temperature, max_tokens=judge.max_tokens)
            except EngineError:
                return None
        return parse_tooleyes_ratings(text)

    try:
        return list(await asyncio.gather(*(rate(t) for t in trajectories)))
    finally:
        await engine.aclose()


@dataclass
class ToolEyesResult:
    rows: list[dict] = field(default_factory=list)  # one per trajectory
    unrated: int = 0  # judge calls that failed: their trajectories have no judged scores
    ratings_missing: int = 0  # trajectories whose judge answer lacked a rating (each missing one counted 0)


def score(answers: str | Path, judge: JudgeSettings | None = None) -> ToolEyesResult:
    """Score every trajectory; without a judge only the rule-based parts (s_FA, tool reality)."""
    trajectories = load_trajectories(answers)
    ratings = asyncio.run(_rate_all(trajectories, judge)) if judge else [None] * len(trajectories)
    result = ToolEyesResult()
    for t, found in zip(trajectories, ratings, strict=True):
        result.unrated += judge is not None and found is None
        rating = None if found is None else {name: found.get(name, 0.0) for name in TOOLEYES_RATINGS}
        result.ratings_missing += found is not None and len(found.keys() & set(TOOLEYES_RATINGS)) < 5
        result.rows.append(
            {
                "model": t.model,
                "scenario": t.group,
                "query_id": t.query_id,
                "ratings": found,  # as the judge gave them (None: its call failed)
                **capability_scores(t, rating),
            }
        )
    return result


def table(rows: list[dict]) -> dict[str, dict[str, dict[str, float | None]]]:
    """{model: {scenario and "All": {capability: mean in %, "n": trajectories, "rated": those with judged scores}}}
    (judged means over the rated trajectories: all but those whose judge call failed)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        scenarios = group_order({r["scenario"] for r in mine})
        for scenario in [*scenarios, "All"]:
            chosen = mine if scenario == "All" else [r for r in mine if r["scenario"] == scenario]
            cells: dict[str, float | None] = {}
            for name in (*CAPABILITIES, "overall", "tool_reality"):
                values = [r[name] for r in chosen if r[name] is not None]
                cells[name] = round(100 * statistics.fmean(values), 2) if values else None
            cells["n"] = len(chosen)
            cells["rated"] = sum(r["overall"] is not None for r in chosen)
            out.setdefault(model, {})[scenario] = cells
    return out


def report_markdown(result: ToolEyesResult, judge: JudgeSettings | None) -> str:
    """ToolEyes' capability table (its Table 3 layout: one column per capability, overall last), per scenario."""

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}"

    lines = [
        "# ToolEyes capability scores",
        "",
        "| Model | Scenario | n | s_FA | s_IC | s_BP | s_TS | s_AO | Overall | tool reality |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, scenarios in table(result.rows).items():
        for scenario, c in scenarios.items():
            lines.append(
                f"| {model} | {scenario} | {c['n']} | "
                + " | ".join(cell(c[k]) for k in (*CAPABILITIES, "overall", "tool_reality"))
                + " |"
            )
    judged = (
        f"judge {judge.model} ({', '.join(judge.base_urls)}), prompt tooleyes-v1"
        if judge
        else "no judge: s_IC, s_BP, s_TS, s_AO and Overall need one (—)"
    )
    lines += [
        "",
        f"Scores in %. s_FA and tool reality by rule; {judged}. Judge answers lacking a rating (each missing "
        f"rating counts 0, as in ToolEyes): {result.ratings_missing}. Unrated trajectories (judge calls that "
        f"failed, left out of the judged means: rerun): {result.unrated}. Formulas and differences from ToolEyes: "
        "mirrorapi/evaluation/benchmarks/tooleyes.py.",
    ]
    return "\n".join(lines) + "\n"


def write_report(result: ToolEyesResult, judge: JudgeSettings | None, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tooleyes_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in result.rows), encoding="utf-8")
    (out / "tooleyes.json").write_text(json.dumps(table(result.rows), indent=2) + "\n", encoding="utf-8")
    (out / "tooleyes.md").write_text(report_markdown(result, judge), encoding="utf-8")
    return out / "tooleyes.md"


# ------------------------------------------------------------------------------- command line
def parser(doc: str | None = None, prog: str | None = None):
    import argparse

    p = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument(
        "--answers", required=True, help="Converted answers: <model>/<group>.json (eval/run_agent.py --out)."
    )
    p.add_argument("--out", required=True, type=Path, help="Output folder for tooleyes.md, .json and rows.")
    judge = p.add_argument_group("the judge (without --base-url: the rule-based parts only)")
    # The judge's flags are JudgeSettings' fields; the token cap defaults lower (a ToolEyes verdict: five short lines).
    add_settings_arguments(judge, JudgeSettings, required=False, defaults={"max_tokens": TOOLEYES_MAX_TOKENS})
    return p


def judge_from(args) -> JudgeSettings | None:
    """The judge of the command line, or None (rule-based parts only); ValueError (SettingsError) if unusable."""
    if not args.base_urls:
        return None
    if not args.model:
        raise ValueError("--base-url needs --model (the judge's model name)")
    return settings_from_args(args, JudgeSettings)
