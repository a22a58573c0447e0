"""What a fidelity run replays, against which server, and how (`FidelitySettings`). Each field is also a flag of
eval/simulator.py and `mirrorapi eval simulator` (mirrorapi/command_line.py), its help the description."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from mirrorapi.command_line import Flag


@pydantic_dataclass
class FidelitySettings:
    pairs: Annotated[list[str], Flag(metavar="HELDOUT.jsonl")] = Field(
        description=("Held-out real pairs (the pair schema of shared/data/pairs).")
    )
    server: str = Field(description="The virtual server, e.g. http://127.0.0.1:8080 (or .../virtual).")
    out: str = Field(description="Output folder (created).")
    baseline_pairs: Annotated[list[str], Flag(metavar="TRAIN.jsonl")] = Field(
        default_factory=list, description="Training pairs for the nearest-example baseline."
    )
    tools: Annotated[list[str], Flag(metavar="FOLDER")] = Field(
        default_factory=list, description="Tool docs (folders or files) for schema conformance."
    )
    embedding_model: Annotated[str | None, Flag(metavar="PATH")] = Field(
        default=None, description="A local transformers model folder for embedding cosine (optional)."
    )
    history: Literal["off", "on", "both"] = Field(
        default="off",
        description=(
            "off: each call alone; on: one session per episode (X-Session-Id); both: both passes, with per-step "
            "fidelity and the consistency score of each."
        ),
    )
    session_values: Literal["carried", "recorded"] = Field(
        default="carried",
        description=(
            "In sessions, carried: a request sends the values (a token, an id) the simulator's earlier answers gave "
            "where the recorded request sent the real answers' values, as an agent reading the simulated answers "
            "would, and the answer is scored with them named back; recorded: every request as recorded."
        ),
    )
    heldout_episodes: bool = Field(
        default=False,
        description=(
            "Keep only the episodes data/build_simulator_sft.py holds out (test_id, test_ood; default fractions and "
            "seed); needs --tools."
        ),
    )
    heldout_history: Annotated[int, Flag(metavar="K")] = Field(
        default=0, ge=0, description=("The --history K the SFT set was built with (its split depends on it).")
    )
    max_episodes: Annotated[int | None, Flag(metavar="N")] = Field(
        default=None, ge=1, description=("Replay at most N episodes, taken from each source in turn.")
    )
    include_cache_hits: bool = Field(
        default=False,
        description=(
            "Score the calls the server answered from what its cache held (a recorded answer of the same call) "
            "with the rest; by default they are counted apart and left out."
        ),
    )
    concurrency: int = Field(default=8, ge=1, description="Calls in flight at once (in sessions: episodes).")
    timeout: float = Field(default=120.0, gt=0, description="Seconds per request.")

    @field_validator("embedding_model")
    @classmethod
    def _a_folder(cls, folder: str | None) -> str | None:
        if folder is not None and not Path(folder).is_dir():
            raise ValueError(f"embedding model folder not found: {folder}")
        return folder
