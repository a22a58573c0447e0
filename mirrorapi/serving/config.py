"""Settings of the virtual API server (`ServerSettings`): each declared once, here, and read from here only.

Sources, later wins: the defaults below < a trained model's record, when `model` is its folder (the prompt and
decoding settings it names, `MODEL_RECORD_KEYS`; `model_settings: off` ignores it) < a YAML file (`--config
FILE`, or `MIRRORAPI_CONFIG`) < environment variables `MIRRORAPI_<KEY>` (e.g. `MIRRORAPI_PORT=8081`; lists
comma-separated) < command-line flags `--<key> VALUE` (`--tools-folder A B`). Relative paths in a YAML file are
taken from the file's folder; those from the environment or the command line from the working directory.

StableToolBench's keys mean what they mean there (`api_key`, `api_base`, `model`, `temperature`,
`tools_folder`, `port` of its `config_mirrorapi.yml`; `cache_folder`, `is_save`, `log_file` of its
`config.yml`; `toolbench_url` is accepted and ignored: mirrorapi never calls real APIs). Everything is
checked here, before the server starts: an unknown key, a wrong type or a missing folder is one
`ConfigError` line, never a failure at the first request.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mirrorapi.command_line import (
    SettingsError,
    add_settings_arguments,
    cleared,
    environment_values,
    one_line,
    read_yaml_settings,
    settings_values,
)
from mirrorapi.engine_client import NO_API_KEY
from mirrorapi.few_shot import FEW_SHOT_TIES
from mirrorapi.models.catalogue import TRAINING_FILE, read_training_record, serving_settings
from mirrorapi.prompts.simulator_formats import (
    COT_FORMAT,
    DEFAULT_HISTORY_CALLS,
    DEFAULT_SIMULATOR_FORMAT,
    HISTORY_CHAR_BUDGET,
    HISTORY_RULES,
    SIMULATOR_FORMATS,
    STABLETOOLBENCH_REQUEST_SETTINGS,
    check_cot_system_prompt,
    stateless_format,
)

logger = logging.getLogger(__name__)

ENV_PREFIX = "MIRRORAPI_"
CONFIG_ENV = "MIRRORAPI_CONFIG"  # a config file to use when `--config` is not given


ConfigError = SettingsError  # a setting that cannot work; the message is one line that says what to change

# What a trained model's record may set (`mirrorapi.models.catalogue.serving_settings`): how its prompts are built
# and how it decodes; never where the server listens, stores or finds its tools.
MODEL_RECORD_KEYS = frozenset(
    {
        "prompt_format",
        "few_shot",
        "few_shot_char_budget",
        "few_shot_response_chars",
        "few_shot_ties",
        "session_history",
        "session_char_budget",
        "session_history_rule",
        "session_failure_rule",
        "max_tokens",
        "temperature",
    }
)


class ServerSettings(BaseModel):
    """Everything `python serving/main_mirrorapi.py` / `mirrorapi serve` can be told (one field = one key)."""

    model_config = ConfigDict(extra="forbid")

    # StableToolBench keys
    api_key: str = Field(NO_API_KEY, description="Key sent to the engine (vllm serve --api-key).")
    api_base: list[str] = Field(
        ["http://127.0.0.1:12345/v1"],
        description=("OpenAI-compatible engine URL(s) ending in /v1; several are replicas, used round-robin."),
    )
    model: str = Field(
        "mirrorapi",
        description=(
            "The request's `model`: vLLM's --served-model-name or a LoRA module name; for `transformers serve`, "
            "the model folder's absolute path."
        ),
    )
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of the simulator (0: greedy).")
    model_settings: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "auto: when `model` is a local folder holding a trained model's record (mirrorapi_training.json: a "
            "`mirrorapi models get` folder, a training/sft.py output), the prompt and decoding settings it names "
            "are the defaults, below the config file, the environment and flags; off: the record is not read."
        ),
    )
    tools_folder: list[Path] = Field(
        description=("ToolBench tools folder(s) <Category>/<tool>.json, or StableToolBench query files (required).")
    )
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on.")
    cache_folder: Path | None = Field(
        None,
        description=(
            "A StableToolBench cache folder (<cat>/<tool>_for_<cat>/<api>.json), imported into the cache "
            "database at start-up (once; later starts skip an unchanged folder)."
        ),
    )
    is_save: bool = Field(True, description="Store simulated responses in the cache (false: store nothing new).")
    log_file: Path | None = Field(
        None,
        description="Append every request line (one JSON object each) to this "
        "file; stderr gets them at log_level info or debug.",
    )
    toolbench_url: str | None = Field(None, description="Accepted for StableToolBench configs; ignored.")
    # ours
    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 exposes the server).")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description=(
            "Host names, besides this machine's, that a request may be addressed to (its Host) and a web page's "
            "Origin may name, e.g. a reverse proxy's public name; others get HTTP 421 (Host, on a server listening "
            "on this machine only) or 403 (Origin)."
        ),
    )
    server_api_key: str | None = Field(
        None,
        description=(
            "Key clients must send (Authorization: Bearer KEY, or StableToolBench's toolbench_key header); "
            "other requests get HTTP 401. /health and /live stay open. Set it before binding a non-loopback host."
        ),
    )

    @field_validator("server_api_key")
    @classmethod
    def _a_key_is_not_blank(cls, value: str | None) -> str | None:
        # A blank key turned the key check off, silently (a key of spaces could never match: bearer values are
        # stripped). Unset it to run without one.
        if value is not None and not value.strip():
            raise ValueError("server_api_key: a blank key; unset it to run without one")
        return value

    max_body_bytes: int = Field(1_048_576, gt=0, description="Largest request body; a larger one gets HTTP 413.")
    max_arguments_chars: int = Field(
        16_384,
        gt=0,
        description=(
            "Largest tool_input (characters of JSON) sent to the engine; a larger miss is an error observation."
        ),
    )
    request_timeout: float = Field(
        10.0,
        gt=0,
        description=(
            "Seconds a client may take to send one whole request (headers and body); slower ones are disconnected."
        ),
    )
    cache_path: Path = Field(Path("mirrorapi_cache.sqlite"), description="The SQLite cache database.")
    cache_url: str | None = Field(
        None,
        description=(
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE: keep the cache and the sessions on PostgreSQL (the "
            "same schema), shared by every server on it, on any host; unset: the SQLite file cache_path."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        description=(
            "Server processes (uvicorn's workers) on one port, sharing the cache, the metrics and the request log."
        ),
    )
    mode: Literal["simulate", "replay"] = Field(
        "simulate",
        description=("simulate: a cache miss asks the engine; replay: cache only, a miss is an error observation."),
    )
    simulator_identity: str | None = Field(
        None,
        min_length=1,
        description=(
            "Look simulated answers up, and store new ones, under this simulator identity instead of the one "
            "computed from model, prompt format and decoding settings (`mirrorapi cache stats` lists those a cache "
            "holds). With mode replay it reproduces a published run's answers exactly."
        ),
    )
    missing_required: Literal["reject", "simulate"] = Field(
        "reject",
        description=(
            "A call without a required argument: reject it like a real API (no engine call), or simulate it."
        ),
    )
    unknown_arguments: Literal["simulate", "reject"] = Field(
        "simulate", description=("A call with arguments the doc does not list: simulate it, or reject it.")
    )
    engine_timeout: float = Field(60.0, gt=0, description="Seconds an engine call may take, retries included.")
    engine_attempt_timeout: float | None = Field(
        None,
        gt=0,
        description=(
            "Seconds an attempt may take when another replica could take the next one; a slower replica is "
            "given up. The last replica standing may use what is left of engine_timeout. Unset: engine_timeout "
            "shared by the replicas an attempt can fail over to (said at start-up)."
        ),
    )
    engine_retries: int = Field(
        2,
        ge=0,
        description=(
            "Further attempts after a failed one: on another replica at once, else after a jittered backoff."
        ),
    )
    engine_cooldown: float = Field(
        10.0,
        ge=0,
        description=(
            "Seconds a replica that failed is skipped; then it is probed and gets calls again once it answers."
        ),
    )
    engine_max_in_flight: int = Field(
        64,
        gt=0,
        description=(
            "Simulator calls in flight per replica; more wait for a free one (a CPU engine given many calls at "
            "once answers none of them in time). With workers, each worker process takes its share (rounded up)."
        ),
    )
    engine_max_waiting: int = Field(
        256,
        ge=0,
        description=(
            "Simulator calls that may wait for a free replica; a miss beyond gets an error observation at once "
            "(the simulator is busy) instead of a long wait."
        ),
    )
    max_tokens: int = Field(1024, gt=0, description="Most tokens the simulator may generate per response.")
    # A Literal of the formats' tuple (pydantic spreads it; a static checker cannot).
    prompt_format: Literal[SIMULATOR_FORMATS] = Field(  # type: ignore[valid-type]
        DEFAULT_SIMULATOR_FORMAT,
        description=(
            "Simulator prompt format (mirrorapi/prompts/simulator_formats.py): the one the model was trained with."
        ),
    )
    system_prompt_file: Path | None = Field(
        None,
        description=("System prompt text file; required by the stabletoolbench formats (released MirrorAPI weights)."),
    )
    structured_output: bool = Field(
        True, description=("Ask the engine for JSON of the observation schema (response_format json_schema).")
    )
    few_shot: int = Field(0, ge=0, description="Real cached examples of the same API shown to the simulator.")
    few_shot_char_budget: int = Field(2048, gt=0, description="Most characters of examples per prompt.")
    few_shot_response_chars: int = Field(
        0,
        ge=0,
        description=(
            "Shrink each example's response to about this many characters (valid JSON kept; 0: show examples whole, "
            "skipping those over the budget). Match the simulator's training data."
        ),
    )
    few_shot_ties: Literal[FEW_SHOT_TIES] = Field(  # type: ignore[valid-type]
        "shortest",
        description=(
            "Which of the equally similar examples is shown: the shortest, or the one of median size. Match the "
            "simulator's training data (its data option of the same name)."
        ),
    )
    seed: int | None = Field(
        None,
        description=(
            "Sampling seed sent to the engine (the stabletoolbench formats: 42, as upstream sends; with them "
            "max_tokens defaults to 2048 and structured_output to false, also as upstream)."
        ),
    )
    second_try_temperature: float = Field(
        0.7,
        ge=0,
        description=(
            "An answer cut at max_tokens (a greedy small model's loop) is asked once more, sampled at this "
            "temperature with `seed` (or 0), and the second answer kept when it ends before the limit; 0: never "
            "(the stabletoolbench formats: 0, as upstream)."
        ),
    )
    session_history: int = Field(
        DEFAULT_HISTORY_CALLS,
        ge=0,
        description=(
            "Earlier calls of a session (X-Session-Id, the MCP session) shown to the simulator, newest first, in "
            "prompt format mirrorapi-session-v1 (mirrorapi-session-v2 with prompt_format mirrorapi-v2); 0 ignores "
            "session ids (every call is simulated alone)."
        ),
    )
    session_char_budget: int = Field(
        HISTORY_CHAR_BUDGET, gt=0, description=("Most characters of session history per prompt (whole calls only).")
    )
    session_history_rule: Literal[HISTORY_RULES] = Field(  # type: ignore[valid-type]
        "recent",
        description=(
            "Which of those calls a prompt shows: every one (recent), or only those related to the call asked "
            "(related: a call of the same API, or one whose request or answer holds one of the call's argument "
            "values); a call with none to show is the stateless call. Match the simulator's training data (its data "
            "option history_rule)."
        ),
    )
    session_failure_rule: Literal["any", "related", "alone"] = Field(
        "any",
        description=(
            "Which failures a simulated answer in a session may give: any the model answers (any); only those the "
            "calls it was shown could cause (related: a failure answered to a call none of whose shown earlier calls "
            "is related to it, as session_history_rule's related rule tells, is replaced by the call's answer alone: "
            "the stateless call's, recorded, cached or simulated); or only those the call alone gives too (alone: "
            "every failure is checked against the call's answer alone, which replaces it where that is no failure)."
        ),
    )
    session_ttl: float = Field(
        3600.0,
        gt=0,
        description=(
            "Seconds a session is kept after its last call (in the cache store, so sessions survive a restart); "
            "a later call starts it over."
        ),
    )
    mcp_toolset: str = Field(
        "",
        description=(
            "Tools that /mcp lists when its URL names none, in toolset syntax "
            "(`category=Data&tool=APIBank/apibank_account&api=C/T/A&query=<query_id>`); empty: every API."
        ),
    )
    mcp_max_sessions: int = Field(
        4096,
        gt=0,
        description=("MCP sessions open at once on a server process; an `initialize` beyond gets HTTP 503 saying so."),
    )
    mcp_sessions_per_client: int = Field(
        1024,
        gt=0,
        description=("MCP sessions one client address may hold open at once (one client cannot take them all)."),
    )
    mcp_session_idle_timeout: float = Field(
        300.0,
        gt=0,
        description=("Seconds an MCP session may go without a request before it is closed (its id then answers 404)."),
    )
    max_episodes: int = Field(
        16384,
        gt=0,
        description=(
            "OpenEnv episodes open at once (WebSocket connections at /ws and HTTP episodes together); a reset beyond "
            "is refused saying so."
        ),
    )
    episode_idle_timeout: float = Field(
        900.0,
        gt=0,
        description=(
            "Seconds an OpenEnv episode opened over HTTP (POST /reset) is kept without a request (one on /ws lives "
            "as long as its connection)."
        ),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")

    @field_validator("api_base", "tools_folder", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, (str, os.PathLike)) else [] if value is None else value

    @field_validator("api_key", mode="before")
    @classmethod
    def _no_key(cls, value: Any) -> Any:
        # StableToolBench's own config.yml leaves `api_key:` blank, to be filled in: null is no key, as the default.
        return NO_API_KEY if value is None else value

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        # A session format names the pair (a model trained on `--prompt-format mirrorapi-session-v2` data): calls
        # outside a session are asked in its stateless format, as the data builder renders them and as a model
        # record's value is read.
        self.prompt_format = stateless_format(self.prompt_format)
        if not any(self.api_base):  # StableToolBench's config.yml leaves it blank: its OpenAI client's cloud
            raise ValueError(
                "api_base: none given (StableToolBench's blank api_base is OpenAI's cloud, which mirrorapi never "
                "calls): give the engine's URL, e.g. http://127.0.0.1:12345/v1 (scripts/serve_engine_cpu.sh)"
            )
        if any(not b.startswith(("http://", "https://")) for b in self.api_base):
            raise ValueError(f"api_base: expected http(s) URL(s) ending in /v1, got {self.api_base}")
        if any(
            urllib.parse.urlsplit(base).password is not None or "@" in urllib.parse.urlsplit(base).netloc
            for base in self.api_base
        ):
            # The engine's key goes as `Authorization: Bearer` (api_key); aiohttp refuses a URL's user:password
            # beside it, so every miss failed and /health answered 500. Said without the URL: it holds a password.
            raise ValueError(
                "api_base: a URL with user:password@ in it; give the engine's key as api_key (sent as a bearer token)"
            )
        if any("," in base for base in self.api_base):  # one URL holding a comma list: the replicas are a list
            raise ValueError(
                f"api_base: {next(b for b in self.api_base if ',' in b)!r} holds a comma: give each replica as an "
                "item of the list (YAML), a flag each (--api-base A --api-base B, or --api-base A B), or "
                "MIRRORAPI_API_BASE=A,B"
            )
        if self.prompt_format.startswith("stabletoolbench"):
            if self.system_prompt_file is None:
                raise ValueError(
                    f"prompt_format {self.prompt_format} needs system_prompt_file "
                    "(the system prompt the MirrorAPI model was trained with)"
                )
            for key, value in STABLETOOLBENCH_REQUEST_SETTINGS.items():  # upstream's request, unless set
                if key not in self.model_fields_set:
                    setattr(self, key, value)
            # The released weights answer calls alone: their formats have no session prompt (ours would be a
            # prompt they never saw), so session ids are ignored.
            if "session_history" in self.model_fields_set and self.session_history:
                raise ValueError(
                    f"session_history: prompt_format {self.prompt_format} answers calls alone (it has no session "
                    "prompt); set 0"
                )
            self.session_history = 0
        self._check_files()
        if self.cache_url is not None and not self.cache_url.startswith(("postgresql://", "postgres://")):
            raise ValueError(
                f"cache_url: expected postgresql://..., got {self.cache_url.split(':', 1)[0]}:... "
                "(a SQLite cache is set with cache_path)"
            )
        if self.prompt_format == COT_FORMAT:
            check_cot_system_prompt(self.system_prompt() or "")  # refused at start, not on every request
        return self

    def _check_files(self) -> None:
        """The paths given: what must be there is, and what is read is readable (refused at start, not at every
        request)."""
        if not self.tools_folder:
            raise ValueError("tools_folder: give at least one tools folder")
        for folder in self.tools_folder:
            if not folder.exists():
                raise ValueError(f"tools_folder: {folder} does not exist")
        if self.cache_folder is not None and not self.cache_folder.is_dir():
            raise ValueError(f"cache_folder: {self.cache_folder} is not a folder")
        if self.system_prompt_file is not None:
            if not self.system_prompt_file.is_file():
                raise ValueError(f"system_prompt_file: {self.system_prompt_file} does not exist")
            try:
                prompt = self.system_prompt()
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"system_prompt_file: {self.system_prompt_file} is not UTF-8 text ({exc.reason})"
                ) from None
            if not (prompt or "").strip():
                raise ValueError(f"system_prompt_file: {self.system_prompt_file} is empty")
        if self.log_file is not None and self.log_file.is_dir():
            raise ValueError(f"log_file: {self.log_file} is a folder, expected a file to append to")
        if self.cache_path.exists() and self.cache_path.is_dir():
            raise ValueError(f"cache_path: {self.cache_path} is a folder, expected a database file")
        if self.cache_url is None and str(self.cache_path).startswith((":memory:", "file::memory:")):
            # The store writes on a connection of its own (sqlite.py's LoopWriter): an in-memory database is each
            # connection's own, so every write failed ("no such table"), and workers would share nothing either.
            raise ValueError(
                f"cache_path: {self.cache_path} is an in-memory database, which the cache cannot use (it reads and "
                "writes on connections of their own, and each would see another, empty database); give a file "
                "(a temporary one for a cache thrown away: e.g. /tmp/mirrorapi-cache.sqlite)"
            )

    def startup_warnings(self) -> list[str]:
        """Settings that start but are probably not what the user meant; one line each."""
        warnings = []
        for base in self.api_base:
            if not base.rstrip("/").endswith("/v1"):
                warnings.append(
                    f"api_base {base} does not end in /v1: OpenAI-compatible engines (vllm serve, "
                    f"transformers serve) answer at {base.rstrip('/')}/v1/chat/completions"
                )
        if not is_loopback(self.host) and not self.server_api_key:
            warnings.append(
                f"host {self.host} is reachable from other machines and server_api_key is not set: "
                "anyone who can reach it can use the simulator and fill its cache"
            )
        return warnings

    def attempt_timeout(self) -> float:
        """`engine_attempt_timeout`, or when unset the deadline shared by the replicas a call can try (at most
        `engine_retries` + 1): with two replicas and `engine_timeout` 8, 4 s, so that a hung replica leaves
        time for the other one."""
        if self.engine_attempt_timeout is not None:
            return min(self.engine_attempt_timeout, self.engine_timeout)
        return self.engine_timeout / max(1, min(len(self.api_base), self.engine_retries + 1))

    def attempt_timeout_reason(self) -> str:
        """One line for the start-up log: the attempt timeout chosen, and why."""
        chosen = self.attempt_timeout()
        if self.engine_attempt_timeout is not None:
            how = "engine_attempt_timeout"
        else:
            tries = max(1, min(len(self.api_base), self.engine_retries + 1))
            how = (
                f"engine_attempt_timeout unset: engine_timeout {self.engine_timeout:g} s shared by the {tries} "
                "replicas a call can try"
                if tries > 1
                else "engine_attempt_timeout unset, one replica to try: the whole engine_timeout"
            )
        return (
            f"engine: {len(self.api_base)} replica(s); a call may take {self.engine_timeout:g} s, an attempt "
            f"{chosen:g} s before the next replica is tried ({how})"
        )

    def system_prompt(self) -> str | None:
        return self.system_prompt_file.read_text(encoding="utf-8") if self.system_prompt_file else None

    def non_default(self) -> dict:
        """Settings that differ from the defaults, as JSON values (logged at start-up)."""
        fields = type(self).model_fields
        defaults = {k: f.get_default(call_default_factory=True) for k, f in fields.items() if not f.is_required()}
        return {
            k: v
            for k, v in self.model_dump(mode="json").items()
            if k not in defaults or v != defaults[k] and str(v) != str(defaults[k])
        }


def is_loopback(host: str) -> bool:
    """Whether `host` is only reachable from this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


FIELDS = ServerSettings.model_fields


def model_record_settings(model: str) -> dict:
    """The settings (`MODEL_RECORD_KEYS`) a trained model's record says it must be served with, when `model` is the
    model's folder; else none. Its prompt format is the stateless one: a session's calls get the session format."""
    folder = Path(model).expanduser()
    record = read_training_record(folder) if folder.is_dir() else None
    if not record:
        return {}
    if record.get("kind") == "judge":
        # Its record's settings (16 tokens, a verdict's prompt format) served as a simulator: every miss answered with
        # a cut verdict, stored in the cache as the API's answer.
        raise ConfigError(
            f"model: {model} is a judge (its {TRAINING_FILE} says kind 'judge'), not a simulator: give the "
            "simulator's folder (model_settings: off serves it without its record)"
        )
    settings = {k: v for k, v in serving_settings(record).items() if k in MODEL_RECORD_KEYS}
    if isinstance(settings.get("prompt_format"), str):
        settings["prompt_format"] = stateless_format(settings["prompt_format"])
    return settings


def load_settings(
    config: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServerSettings:
    """Settings from a YAML file, the environment and explicit overrides, over those the model's record names;
    raises `ConfigError`."""
    environ = os.environ if environ is None else environ
    config = config or environ.get(CONFIG_ENV)
    data = read_yaml_settings(config, ServerSettings) if config else {}
    given_by = dict.fromkeys(data, "config")  # where each value came from, to name it as it was given
    from_environment = environment_values(ServerSettings, ENV_PREFIX, environ)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    for source, values in (("environment", from_environment), ("flag", flags)):
        data.update(values)
        given_by.update(dict.fromkeys(values, source))
    if data.get("model_settings", FIELDS["model_settings"].default) == "auto":
        for key, value in model_record_settings(str(data.get("model", FIELDS["model"].default))).items():
            if key not in data:  # below every source the user gave
                data[key], given_by[key] = value, "record"
    data = cleared(data, ServerSettings)  # "null"/"none" from the environment or a flag clear a setting
    try:
        settings = ServerSettings.model_validate(data)
    except ValidationError as exc:

        def spelt(key: str) -> str:  # the key as its source names it
            source = given_by.get(key)
            if source == "flag":
                return "--" + key.replace("_", "-")
            if source == "environment":
                return ENV_PREFIX + key.upper()
            return f"{key} (the model's record)" if source == "record" else key

        failing = {given_by.get(str(e["loc"][0]) if e["loc"] else "") for e in exc.errors()}
        where = f"config {config}" if config and failing <= {"config", None} else "settings"
        raise ConfigError(f"{where}: {one_line(exc, ServerSettings, spelt)}") from None
    if settings.toolbench_url:
        logger.warning("toolbench_url is ignored: mirrorapi never calls real APIs")
    return settings


# ------------------------------------------------------------------------------ command line
def add_server_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--config FILE` plus one flag per settings key (`--tools-folder` or `--tools_folder`)."""
    parser.add_argument("--config", metavar="FILE", help=f"YAML settings file (default: ${CONFIG_ENV}).")
    group = parser.add_argument_group("settings (each overrides the config file and MIRRORAPI_<KEY>)")
    add_settings_arguments(group, ServerSettings, required=False, underscore_spelling=True)
    return parser


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerSettings:
    return load_settings(args.config, settings_values(args, ServerSettings), environ)
