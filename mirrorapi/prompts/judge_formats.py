"""The judges' prompt formats and the parsers of their answers.

Judge formats
- `fac-v1`: query + final answer -> `Verdict: Solved|Unsolved` and `Reason: ...` on labelled lines.
- `sopr-v1`: query + the trajectory's tool calls + final answer -> `Verdict: Solved|Unsolved|Unsure`
  (StableToolBench's SoPR statuses; Unsure scores 0.5) and `Reason: ...`.
- `sowr-v1`: query + two answers (A, B) with their tool calls -> `Preferred: A|B` and `Reason: ...`
  (the pairwise step of StableToolBench's SoWR).
- `tooleyes-v1`: query + the trajectory's tool calls + final answer -> five labelled 0-10 ratings
  (`Focus`, `Validity`, `Quality`, `Selection`, `Relevance`: five lines), ToolEyes' judged criteria.
Both show the judge the text of the final answer (`extract_final_answer`), query and answer cut by
`cut_judge_text`, for FAC, judge agreement and the judge's training data alike.
"""

from __future__ import annotations

import json
import re
from typing import Any

import json_repair

from mirrorapi.prompts.simulator_formats import cut_text

JUDGE_FORMATS = ("fac-v1", "sopr-v1")
TOOLEYES_FORMAT = "tooleyes-v1"  # see the ToolEyes block below
PREFERENCE_FORMATS = ("sowr-v1",)
DEFAULT_JUDGE_FORMAT = "fac-v1"

FAC_SYSTEM_V1 = (
    "You decide whether an AI assistant's final answer solves a user's query. Judge the final answer "
    "alone and do not check its facts against your own knowledge.\n"
    "Solved: the answer genuinely addresses every part of the query and gives what was asked for; after "
    "reasonable attempts, reporting that nothing could be found also counts.\n"
    "Unsolved: a refusal, an apology or a promise instead of an answer, an answer that leaves a part of "
    "the query unaddressed, or an answer about something else.\n"
    "Reply in exactly this form:\n"
    "Verdict: Solved or Unsolved\n"
    "Reason: one short sentence"
)

VERDICTS = ("Solved", "Unsolved", "Unsure")
_LABELLED = re.compile(
    r"^[\s*#>_-]*(?:verdict|answer status)[\s*_]*[:：]?[\s*_]*\n?[\s*_]*(unsolved|solved|unsure)\b",
    re.IGNORECASE | re.MULTILINE,
)
# "Verdict: Solved or Unsolved" is the prompt's format line echoed back (small judges do), not a verdict.
_ECHOED_VERDICTS = re.compile(
    r"[\s*_]*(?:,|/|\bor\b)[\s*_]*(?:or\b)?[\s*_]*(?:unsolved|solved|unsure)\b", re.IGNORECASE
)
_REASON = re.compile(r"^[\s*#>_-]*reason[\s*_]*[:：]?[\s*_]*(.*)", re.IGNORECASE | re.MULTILINE | re.DOTALL)


SOPR_SYSTEM_V1 = (
    "You decide whether an AI assistant solved a user's query, from the tool calls it made and its final "
    "answer. Do not check facts against your own knowledge.\n"
    "Solved: the final answer addresses every part of the query and agrees with the tool results.\n"
    "Unsolved: a refusal, an apology or a promise instead of an answer, a part of the query left "
    "unaddressed, an answer that contradicts the tool results, or tool calls that all failed.\n"
    "Unsure: the answer looks complete, but the tool results neither confirm nor contradict it.\n"
    "Reply in exactly this form:\n"
    "Verdict: Solved, Unsolved or Unsure\n"
    "Reason: one short sentence"
)

# The verdicts each judge format may give (what `parse_verdict` accepts for it).


def query_group(query: str) -> str:
    """The unit a query's labelled answers share (its text, case and spaces aside): a tau-bench task's trials, an
    AnyToolBench reference answer and its mismatch. They stay on one side of the judge's split, and the judge's
    agreement intervals resample them together: they are no independent draws."""
    return re.sub(r"\s+", " ", query.strip().lower())


JUDGE_VERDICTS = {"fac-v1": ("Solved", "Unsolved"), "sopr-v1": ("Solved", "Unsolved", "Unsure")}


# Queries and answers longer than this are cut (and marked) before a judge sees them, by FAC, judge
# agreement and the judge's training data alike: one huge answer cannot exceed a judge's context
# and fail on every rerun, and a judge is trained on what it is shown.
JUDGE_TEXT_CHAR_BUDGET = 8000
# What a final answer may hold instead of text to judge (scored Unsolved without a judge call).
EMPTY, GIVE_UP = "empty", "give_up"


def cut_judge_text(text: str) -> str:
    """`text` stripped and cut to JUDGE_TEXT_CHAR_BUDGET characters (+ TRUNCATION_MARK when cut)."""
    return cut_text(text.strip(), JUDGE_TEXT_CHAR_BUDGET)


def extract_final_answer(final_answer: Any) -> tuple[str, str]:
    """(status, text) of a converted answer's `final_answer` field.

    The field usually holds the raw Finish arguments, `{"return_type": ..., "final_answer": ...}`:
    the inner text is what gets judged (StableToolBench's FAC script judged the whole JSON string,
    notes §8.21). `give_up_and_restart` -> GIVE_UP; nothing to judge -> EMPTY. Text that is not
    Finish JSON (another agent's plain answer) is judged as it is.
    """
    if final_answer is None:
        return EMPTY, ""
    text = final_answer if isinstance(final_answer, str) else json.dumps(final_answer, ensure_ascii=False)
    text = text.strip()
    if not text:
        return EMPTY, ""
    finish = _finish_arguments(text)
    if finish is None:
        return ("answer", text) if "give_up_and_restart" not in text else (GIVE_UP, "")
    if str(finish.get("return_type", "")).strip() == "give_up_and_restart":
        return GIVE_UP, ""
    inner = finish.get("final_answer", "")
    inner = (inner if isinstance(inner, str) else json.dumps(inner, ensure_ascii=False)).strip()
    return ("answer", inner) if inner else (EMPTY, "")


def _finish_arguments(text: str) -> dict | None:
    """The Finish arguments dict, also from the slightly broken JSON agents write; None when not Finish JSON."""
    if not text.startswith("{") or ("final_answer" not in text and "return_type" not in text):
        return None
    try:
        parsed = json.loads(text, strict=False)  # strict=False: raw newlines inside strings, as agents write them
    except ValueError:
        parsed = json_repair.loads(text)
    return parsed if isinstance(parsed, dict) and ("final_answer" in parsed or "return_type" in parsed) else None


def judge_messages(query: str, answer: str, fmt: str = DEFAULT_JUDGE_FORMAT, steps: str = "") -> list[dict]:
    """The judge's chat messages; `steps` (the rendered tool calls) is used by `sopr-v1` only.

    `answer` is the text to judge (`extract_final_answer`); query and answer are cut by
    `cut_judge_text` here, so every caller (FAC, judge agreement, training data) shows the same."""
    query, answer = cut_judge_text(query), cut_judge_text(answer)
    if fmt == "sopr-v1":
        return [
            {"role": "system", "content": SOPR_SYSTEM_V1},
            {
                "role": "user",
                "content": f"Query:\n{query}\n\nTool calls:\n{steps.strip() or '(none)'}\n\nFinal answer:\n{answer}",
            },
        ]
    if fmt != "fac-v1":
        raise ValueError(f"unknown judge prompt format {fmt!r}; known: {', '.join(JUDGE_FORMATS)}")
    return [
        {"role": "system", "content": FAC_SYSTEM_V1},
        {"role": "user", "content": f"Query:\n{query}\n\nFinal answer:\n{answer}"},
    ]


def judge_completion(verdict: str, reason: str = "") -> str:
    """The judge's training target: the verdict line, and a reason line when one is known."""
    return f"Verdict: {verdict}" + (f"\nReason: {reason.strip()}" if reason.strip() else "")


def parse_verdict(text: str, allowed: tuple[str, ...] = ("Solved", "Unsolved")) -> tuple[str | None, str]:
    """(verdict or None, reason) read from the label line (`Verdict:`, or StableToolBench's `Answer Status`).

    Only the labelled line decides: a reason that mentions "unsolved" does not flip a Solved verdict.
    A bare first line that is exactly a verdict word is accepted too. None when nothing matches.
    """
    text = text or ""
    found = _LABELLED.search(text)
    if found and _ECHOED_VERDICTS.match(text, found.end()):
        return None, ""
    verdict = found.group(1).capitalize() if found else None
    if verdict is None:
        first = next((line.strip(" *#.:`") for line in text.splitlines() if line.strip()), "")
        verdict = first.capitalize() if first.lower() in {v.lower() for v in VERDICTS} else None
    if verdict not in allowed:
        verdict = None
    reason = _REASON.search(text[found.end() :] if found else text)
    return verdict, (reason.group(1).strip() if reason else "")


# ------------------------------------------------------------------------------ SoWR preference
SOWR_SYSTEM_V1 = (
    "You compare two AI assistants' attempts at the same user query and pick the better one. Each "
    "attempt shows the tool calls it made and its final answer. Prefer the answer that solves more of the "
    "query, agrees with its tool results and gives the user more useful information. Do not check facts "
    "against your own knowledge; ignore the order in which the answers are shown.\n"
    "Reply in exactly this form:\n"
    "Preferred: A or B\n"
    "Reason: one short sentence"
)
_PREFERRED = re.compile(
    r"^[\s*#>_-]*(?:preferred|better answer|winner)[\s*_]*[:：]?[\s*_]*(?:answer\s*)?([AB])\b",
    re.IGNORECASE | re.MULTILINE,
)
_ECHOED_CHOICES = re.compile(r"[\s*_]*(?:,|/|\bor\b)[\s*_]*(?:answer\s*)?[AB]\b", re.IGNORECASE)


def preference_messages(
    query: str, answers: tuple[tuple[str, str], tuple[str, str]], fmt: str = "sowr-v1"
) -> list[dict]:
    """The `sowr-v1` judge messages; `answers` = ((steps A, final answer A), (steps B, final answer B))."""
    if fmt not in PREFERENCE_FORMATS:
        raise ValueError(f"unknown preference prompt format {fmt!r}; known: {', '.join(PREFERENCE_FORMATS)}")
    parts = [f"Query:\n{query.strip()}"]
    for label, (steps, answer) in zip("AB", answers, strict=True):
        parts.append(
            f"Answer {label}\nTool calls:\n{steps.strip() or '(none)'}\nFinal answer:\n"
            f"{answer.strip() or '(no final answer)'}"
        )
    return [{"role": "system", "content": SOWR_SYSTEM_V1}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_preference(text: str) -> tuple[str | None, str]:
    """("A" | "B" | None, reason) from a `Preferred: A` line (a bare first line `A` / `B` also counts)."""
    text = text or ""
    found = _PREFERRED.search(text)
    if found and _ECHOED_CHOICES.match(text, found.end()):
        return None, ""  # "Preferred: A or B", the format line echoed back
    choice = found.group(1).upper() if found else None
    if choice is None:
        first = next((line.strip(" *#.:`") for line in text.splitlines() if line.strip()), "")
        choice = first.upper() if first.upper() in ("A", "B") else None
    reason = _REASON.search(text[found.end() :] if found else text)
    return choice, (reason.group(1).strip() if reason else "")


# ------------------------------------------------------------------------------- ToolEyes judge (tooleyes-v1)
# ToolEyes' judged criteria (arXiv 2401.00741; Code/Evaluation/util/utils.py reads them as thought_foucus,
# thought_validity, thought_quality, action_thought_match, relavance, each 0-10), in our own words.
TOOLEYES_RATINGS = ("focus", "validity", "quality", "selection", "relevance")
TOOLEYES_SYSTEM_V1 = (
    "You rate how an AI assistant used tools to serve a user's query. You see the query, the tool calls it made "
    "(with what they returned) and its final answer. Rate each criterion from 0 (worst) to 10 (best):\n"
    "Focus: its steps stay on what the user asked, without drifting to other goals.\n"
    "Validity: its plan of calls is feasible and each step follows from what came before.\n"
    "Quality: the plan is efficient and complete, without useless or repeated calls.\n"
    "Selection: each tool called suits the step it was called for.\n"
    "Relevance: the final answer addresses the query with the information the tools returned.\n"
    "Reply with exactly five lines:\nFocus: N\nValidity: N\nQuality: N\nSelection: N\nRelevance: N"
)
_RATING = re.compile(
    r"^[\s*#>_-]*(focus|validity|quality|selection|relevance)[\s*_]*[:：][\s*_]*(\d+(?:\.\d+)?)",
    re.IGNORECASE | re.MULTILINE,
)


def tooleyes_messages(query: str, steps: str, answer: str) -> list[dict]:
    user = (
        f"Query:\n{cut_judge_text(query)}\n\nTool calls:\n{steps or '(none)'}\n\n"
        f"Final answer:\n{cut_judge_text(answer) or '(none)'}"
    )
    return [{"role": "system", "content": TOOLEYES_SYSTEM_V1}, {"role": "user", "content": user}]


def parse_tooleyes_ratings(text: str) -> dict[str, float]:
    """The ratings (clipped to 0-10) a `tooleyes-v1` answer gives, by name; those it does not give are absent."""
    return {name.lower(): min(10.0, float(value)) for name, value in _RATING.findall(text or "")}
