"""API-Bank's rules for a predicted call: how it is parsed, how its arguments are typed, when it is correct."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

# Parsing a predicted call.
_CALL = re.compile(r"\[(\w+)\((.*)\)\]")
# API-Bank's argument pattern (api_call_extraction.py): quoted values, [lists], or bare words; all become strings.
_ARGUMENT = re.compile(r"(\w+)\s*=\s*['\"](.+?)['\"]|(\w+)\s*=\s*(\[.*\])|(\w+)\s*=\s*(\w+)")


def parse_call(text: str) -> tuple[str, dict[str, str]] | None:
    """(API name, arguments) of the first `[Name(...)]` in a model's output; None when there is none."""
    match = _CALL.search(text)
    if match is None:
        return None
    arguments = {}
    for m in _ARGUMENT.finditer(match.group(2)):
        key, value = (
            (m.group(1), m.group(2))
            if m.group(1)
            else (m.group(3), m.group(4))
            if m.group(3)
            else (m.group(5), m.group(6))
        )
        arguments[key] = value
    return match.group(1), arguments


def typed_arguments(arguments: dict[str, str], types: dict[str, str]) -> dict:
    """API-Bank's `ToolManager.api_call` conversion of the parsed strings: int, float and bool by the declared
    type, everything else (lists included) kept as the string; an unknown parameter or a non-number raises
    ValueError (an assertion there, a wrong call either way). So a list-typed recorded input (AddMeeting's
    attendees) never equals a parsed call's, in API-Bank as here."""
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if key not in types:
            raise ValueError(f"invalid parameter name. parameter: {key}")
        kind = types[key]
        if kind == "int":
            if not value.isdigit():
                raise ValueError(f"invalid parameter type. parameter: {value}")
            out[key] = int(value)
        elif kind == "float":
            if not value.replace(".", "", 1).isdigit():
                raise ValueError("invalid parameter type.")
            out[key] = float(value)
        elif kind == "bool":
            out[key] = value == "True"
        else:
            out[key] = value
    return out


# Each API's `check_api_call_correctness` (api-bank/apis/*.py) compares the executed result {api_name, input,
# output, exception} with the annotated one. Restated here per API; the default is input, output and exception equal.
Result = dict


def _same(*keys: str) -> Callable[[Result, Result], bool]:
    return lambda r, g: all(r[k] == g[k] for k in keys)


def _words_overlap(a: str, b: str) -> bool:
    """API-Bank's content test: Jaccard similarity of the space-split words above 0.5."""
    x, y = set(a.split(" ")), set(b.split(" "))
    return len(x & y) / len(x | y) > 0.5


def _zfill_year(value: str) -> str:
    parts = value.strip().split("-")
    if len(parts) == 3 and len(parts[0]) != 4:
        parts[0] = parts[0].zfill(4)
    return "-".join(parts)


def _date_as(value: str, fmt: str) -> Any:
    """API-Bank's format_check: zero-fill the year, parse with `fmt`. An unparsable value becomes its exception
    object there, equal to nothing; a fresh `object()` here."""
    try:
        return datetime.datetime.strptime(_zfill_year(value), fmt).strftime(fmt)
    except ValueError:
        return object()


def _history_date(value: str) -> str:
    """QueryHistoryToday's filter_date_format: month-day of a %Y-%m-%d or %m-%d date."""
    value = _zfill_year(value)
    for fmt in ("%Y-%m-%d", "%m-%d"):
        try:
            return datetime.datetime.strptime(value, fmt).strftime("%m-%d")
        except ValueError:
            continue
    return object()  # type: ignore[return-value]  # a sentinel equal to no string: no date matches


def _fields(**normalizers: Callable[[Any], Any]) -> Callable[[Result, Result], bool]:
    """Named input fields equal after a normalizer, then output and exception equal."""

    def check(r: Result, g: Result) -> bool:
        return all(norm(r["input"][k]) == norm(g["input"][k]) for k, norm in normalizers.items()) and _same(
            "output", "exception"
        )(r, g)

    return check


def _content(field_name: str, lower: bool, exact: tuple[str, ...] | None) -> Callable[[Result, Result], bool]:
    """Agenda/reminder/meeting APIs: the free-text field by word overlap; `exact` fields (None: all the others)
    equal; then output and exception."""

    def check(r: Result, g: Result) -> bool:
        a, b = r["input"][field_name], g["input"][field_name]
        if not _words_overlap(a.lower() if lower else a, b.lower() if lower else b):
            return False
        if exact is None:
            rest = {k: v for k, v in r["input"].items() if k != field_name}
            if rest != {k: v for k, v in g["input"].items() if k != field_name}:
                return False
        elif any(r["input"][k] != g["input"][k] for k in exact):
            return False
        return _same("output", "exception")(r, g)

    return check


def _delete_by_time(r: Result, g: Result) -> bool:
    """Delete{Agenda,Meeting,Reminder}: both succeeded -> the time alone decides; else output and exception."""
    if g["output"] == "success" and r["output"] == "success":
        return r["input"]["time"] == g["input"]["time"]
    return _same("output", "exception")(r, g)


def _none_output_or(check_inputs: Callable[[Result, Result], bool]) -> Callable[[Result, Result], bool]:
    """APIs returning random ids/tokens: the output only has to be absent when the annotated one is."""

    def check(r: Result, g: Result) -> bool:
        if g["output"] is None and r["output"] is not None:
            return False
        return check_inputs(r, g) and r["exception"] == g["exception"]

    return check


def _scene(compare_output: bool) -> Callable[[Result, Result], bool]:
    def devices(result: Result) -> list:
        items = [
            {**d, "name": d["name"].strip().lower(), "description": d["description"].strip()}
            for d in result["input"]["devices"]
        ]
        return sorted(items, key=lambda d: d["name"])

    def check(r: Result, g: Result) -> bool:
        if r["input"]["name"].strip().lower() != g["input"]["name"].strip().lower() or devices(r) != devices(g):
            return False
        if compare_output and r["output"] != g["output"]:
            return False
        if not compare_output and g["output"] is None and r["output"] is not None:
            return False
        return r["exception"] == g["exception"]

    return check


def _search_engine(r: Result, g: Result) -> bool:
    def ordered(output: Any) -> Any:
        return sorted(output, key=lambda x: x["title"] + x["abstract"], reverse=True) if output is not None else None

    return r["exception"] == g["exception"] and ordered(r["output"]) == ordered(g["output"])


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _upper(value: Any) -> Any:
    return str(value).upper().strip()


_STAMP, _DAY = "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"
RULES: dict[str, Callable[[Result, Result], bool]] = {
    "AddAgenda": _content("content", lower=False, exact=("time", "location")),
    "ModifyAgenda": _content("content", lower=False, exact=("time", "location")),
    "QueryAgenda": _content("content", lower=False, exact=("time", "location")),
    "AddReminder": _content("content", lower=True, exact=("time",)),
    "ModifyReminder": _content("content", lower=True, exact=("time",)),
    "QueryReminder": _content("content", lower=True, exact=("time",)),
    "AddMeeting": _content("meeting_topic", lower=False, exact=None),
    "ModifyMeeting": _content("meeting_topic", lower=False, exact=None),
    "QueryMeeting": _content("meeting_topic", lower=False, exact=None),
    "DeleteAgenda": _delete_by_time,
    "DeleteMeeting": _delete_by_time,
    "DeleteReminder": _delete_by_time,
    "Calculator": _fields(formula=lambda f: f.replace(" ", "")),
    "GetToday": lambda r, g: r["output"] is not None and r["exception"] is None and not r["input"],
    "Dictionary": _same("output", "exception"),
    "Wiki": _same("output", "exception"),
    "ToolSearcher": _same("output", "exception"),
    "PlayMusic": _same("output"),
    "SearchEngine": _search_engine,
    "Translate": _fields(src=lambda s: s),
    "AppointmentRegistration": _none_output_or(
        lambda r, g: all(
            n(r["input"][k]) == n(g["input"][k])
            for k, n in (("patient_name", _strip), ("date", lambda d: _date_as(d, _DAY)), ("doctor_name", _strip))
        )
    ),
    "RegisterUser": _none_output_or(lambda r, g: r["input"] == g["input"]),
    "AddScene": _scene(compare_output=False),
    "ModifyScene": _scene(compare_output=True),
    "DeleteScene": _fields(name=_lower),
    "QueryScene": _fields(name=_lower),
    "CancelRegistration": _fields(appointment_id=_strip),
    "CancelTimedSwitch": _fields(name=_lower, time=lambda t: _date_as(t, _STAMP)),
    "TimedSwitch": _fields(name=_lower, time=lambda t: _date_as(t, _STAMP), on=lambda v: v),
    "DocumentQA": _fields(url=_strip, question=_strip),
    "EmergencyKnowledge": _fields(symptom=_lower),
    "SymptomSearch": _fields(symptom=_lower),
    "ModifyRegistration": _fields(
        appointment_id=lambda v: str(v).strip(),
        new_appointment_date=lambda d: None if d is None else _date_as(d, _DAY),
        new_appointment_doctor=_strip,
    ),
    "QueryBalance": _fields(token=_strip),
    "QueryHealthData": _fields(
        user_id=lambda u: _upper(u) or None,
        start_time=lambda t: _date_as(t, _STAMP),
        end_time=lambda t: _date_as(t, _STAMP),
    ),
    "QueryHistoryToday": _fields(date=_history_date),
    "QueryRegistration": _fields(patient_name=_strip, date=lambda d: _date_as(d, _DAY)),
    "QueryStock": _fields(stock_code=lambda c: _upper(c) or None, date=lambda d: _date_as(d, _DAY)),
    "RecordHealthData": _fields(user_id=_upper, time=lambda t: _date_as(t, _STAMP)),  # health_data not compared
    "SendEmail": _fields(receiver=_lower, subject=_strip, content=_strip),
}


def _default_rule(r: Result, g: Result) -> bool:
    return _same("input", "output", "exception")(r, g)


def call_is_correct(result: Result, truth: Result) -> bool:
    """API-Bank's verdict for an executed call: the API's rule; a missing field counts as wrong (as its KeyError)."""
    try:
        return bool(RULES.get(truth["api_name"], _default_rule)(result, truth))
    except (KeyError, TypeError, AttributeError):
        return False
