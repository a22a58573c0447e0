"""A recorded episode replayed in a session, its later requests carrying the values the simulator gave.

A recorded episode's later requests hold values the agent read off the *real* answers: the token `GetUserToken`
returned, the reservation id a booking returned, the latitude a geocoder returned. Replayed as recorded against a
simulator, that token is one the simulator never issued (it made up its own), so a simulator that keeps its session
consistent must answer "The token is incorrect.", and the replay scores that against the real API's success. An
agent reading the simulated answers would have sent the simulator's token. `EpisodeValues` replays the episode so:

- after each call, a value of the real answer that the simulator's answer holds elsewhere (another value at the
  same place: the same JSON path) is mapped to the simulator's (`learn`), unless the simulator's answers of the
  episode hold the real value too (then it exists in the simulated session as it is);
- a later request's value equal to a mapped one (and to no value of the episode's earlier recorded requests: a
  value the user gave stays) is sent as the simulator's (`request`);
- from that call on, the simulator's answers are scored with those values named back as the real ones
  (`scored`): the same answer, its entities named as the recorded episode names them, so that the real answer
  can be compared with it. The answer that first gave such a value is scored as it was written.

Values are those `session_history.values` counts as carried (ids, tokens, names, numbers of 2+ digits). Written by
hand: no evaluation library replays recorded agent trajectories against a stateful simulator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from mirrorapi.evaluation.fidelity.session_history import values

# A value named back inside a longer text only when it is this long: shorter ones could be parts of other words.
INSIDE_TEXT_CHARS = 6


def _parsed(item: Any) -> Any:
    if isinstance(item, str) and item.strip()[:1] in ("{", "["):
        try:
            return json.loads(item)
        except ValueError:
            pass
    return item


def leaves(item: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(JSON path, value) of every string and number of an answer, JSON held in a string read as JSON."""
    item = _parsed(item)
    if isinstance(item, dict):
        for key, value in item.items():
            yield from leaves(value, (*path, key))
    elif isinstance(item, list):
        for index, value in enumerate(item):
            yield from leaves(value, (*path, index))
    elif isinstance(item, (str, int, float)) and not isinstance(item, bool):
        yield path, item


def _carried(value: Any) -> bool:
    return bool(values(value))


def _same_kind(a: Any, b: Any) -> bool:
    return isinstance(a, str) == isinstance(b, str)


class EpisodeValues:
    """One episode's mapping from the real answers' values to the simulator's (module doc)."""

    def __init__(self) -> None:
        self.mapped: dict[Any, Any] = {}  # a real answer's value -> the simulator's at the same place
        self.renamed: dict[Any, Any] = {}  # those a request was sent with, so far
        self.recorded_requests: set[str] = set()  # values the user gave in the episode's earlier requests
        self.simulated_values: set[str] = set()  # values of the simulator's answers so far
        self.carried: list[list] = []  # [real, simulated] of each value the last request was sent with instead

    def request(self, tool_input: dict) -> dict:
        """The call's arguments as an agent reading the simulated answers would send them."""
        self.carried = []

        def carry(item: Any) -> Any:
            if isinstance(item, dict):
                return {key: carry(value) for key, value in item.items()}
            if isinstance(item, list):
                return [carry(value) for value in item]
            if isinstance(item, (str, int, float)) and not isinstance(item, bool) and item in self.mapped:
                if not values(item) & self.recorded_requests:
                    self.renamed[item] = self.mapped[item]
                    if [item, self.mapped[item]] not in self.carried:
                        self.carried.append([item, self.mapped[item]])
                    return self.mapped[item]
            return item

        sent = carry(tool_input)
        # A value an answer gave (a token) is the answer's each time it is sent again, not one the user gave.
        self.recorded_requests |= values(tool_input) - {v for real, _ in self.carried for v in values(real)}
        return sent

    def learn(self, real_response: Any, simulated: dict) -> None:
        """Map the values of the real answer to the simulator's answer to the same call (a success)."""
        if simulated.get("error") or simulated.get("failed"):
            return
        answer = dict(leaves(simulated.get("response")))
        self.simulated_values |= values(simulated.get("response"))
        for path, real in leaves(real_response):
            own = answer.get(path)
            if (
                own is not None
                and own != real
                and _same_kind(own, real)
                and _carried(real)
                and _carried(own)
                and not values(real) & self.simulated_values
            ):
                self.mapped.setdefault(real, own)

    def scored(self, observation: dict) -> dict:
        """The observation with the values requests were sent with named back as the real ones."""
        if not self.renamed:
            return observation
        back = {own: real for real, own in self.renamed.items()}

        def name_back(item: Any) -> Any:
            if isinstance(item, dict):
                return {(back.get(k, k) if isinstance(k, str) else k): name_back(v) for k, v in item.items()}
            if isinstance(item, list):
                return [name_back(value) for value in item]
            if isinstance(item, bool) or item is None:
                return item
            if item in back and _same_kind(item, back[item]):
                return back[item]
            if isinstance(item, str):  # inside a text, JSON text included, whose formatting stays as written
                for own, real in back.items():
                    if isinstance(own, str) and isinstance(real, str):
                        item = item.replace(json.dumps(own, ensure_ascii=False), json.dumps(real, ensure_ascii=False))
                        if len(own) >= INSIDE_TEXT_CHARS:
                            item = item.replace(own, real)
            return item

        error, response = name_back(observation.get("error")), name_back(observation.get("response"))
        return {**observation, "error": error, "response": response}
