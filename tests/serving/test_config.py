"""Settings: YAML with StableToolBench's keys, environment and flag overrides, one-line errors."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mirrorapi.cli import main as mirrorapi_main
from mirrorapi.models import shipped
from mirrorapi.models.catalogue import TRAINING_FILE
from mirrorapi.serving.config import ConfigError, load_settings

REPO = Path(__file__).resolve().parents[2]
SAMPLE_TOOLS = REPO / "data" / "samples" / "tools"

SCRIPT = REPO / "serving" / "main_mirrorapi.py"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_config_loads_with_stabletoolbench_keys():
    settings = load_settings(REPO / "serving" / "config_mirrorapi.yml", environ={})
    assert settings.port == 8080 and settings.host == "127.0.0.1"
    assert settings.api_base == ["http://127.0.0.1:12345/v1"] and settings.temperature == 0
    assert settings.tools_folder == [SAMPLE_TOOLS]  # relative to the config file's folder
    assert settings.cache_path == REPO / "runs" / "server" / "cache.sqlite"
    assert (settings.mode, settings.missing_required, settings.few_shot) == ("simulate", "reject", 0)


def test_the_released_formats_answer_calls_alone(tmp_path):
    """StableToolBench's MirrorAPI weights were trained on calls alone, in its own prompt: a session's call would
    get our session prompt, which they never saw; so session ids are ignored, and asking for a history is refused."""
    prompt = write(tmp_path / "system.txt", "You are an API simulator.")
    base = {"tools_folder": [str(SAMPLE_TOOLS)], "system_prompt_file": str(prompt)}
    for fmt in ("stabletoolbench", "stabletoolbench-cache"):
        assert load_settings(overrides={**base, "prompt_format": fmt}, environ={}).session_history == 0
        with pytest.raises(ConfigError, match=f"session_history: prompt_format {fmt} answers calls alone"):
            load_settings(overrides={**base, "prompt_format": fmt, "session_history": 8}, environ={})
    assert load_settings(overrides=base, environ={}).session_history == 8  # ours: sessions as before


def test_released_model_config_asks_for_its_system_prompt_file():
    with pytest.raises(ConfigError, match="system_prompt_file: .*mirrorapi_system_prompt.txt does not exist"):
        load_settings(
            REPO / "serving" / "config_mirrorapi_released.yml",
            overrides={"tools_folder": [str(SAMPLE_TOOLS)]},
            environ={},
        )


@pytest.mark.parametrize("blank", ["''", ""], ids=["empty-strings", "no-values"])
def test_stabletoolbench_config_yml_keys_are_accepted(tmp_path, blank):
    """The keys of StableToolBench's server/config.yml, as its users have them: its own file leaves api_key and
    api_base with no value (YAML's null), which was refused as "api_key: Input should be a valid string (got
    None)". A key with no value is no key; a blank api_base is upstream's OpenAI cloud, refused in words."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tool_response_cache").mkdir()
    config = write(
        tmp_path / "config.yml",
        f"api_key: {blank}\napi_base: {blank}\nmodel: gpt-4-turbo\ntemperature: 0\n"
        "toolbench_url: http://8.130.32.149:8080/rapidapi\ntools_folder: ./tools\n"
        "cache_folder: ./tool_response_cache\nis_save: true\nport: 8080\nlog_file: ./server.log\n",
    )
    with pytest.raises(ConfigError, match="^config .*: api_base: none given .*OpenAI's cloud.* give the engine's URL"):
        load_settings(config, environ={})
    settings = load_settings(config, overrides={"api_base": ["http://127.0.0.1:9/v1"]}, environ={})
    assert settings.cache_folder == tmp_path / "tool_response_cache"
    assert settings.log_file == tmp_path / "server.log"
    assert settings.api_key == ("" if blank else "EMPTY")  # a blank key as written; none: vLLM's keyless EMPTY


def test_precedence_defaults_file_environment_flags(tmp_path):
    config = write(tmp_path / "c.yml", f"tools_folder: {SAMPLE_TOOLS}\nport: 9001\nmodel: from-file\n")
    environ = {
        "MIRRORAPI_PORT": "9002",
        "MIRRORAPI_API_BASE": "http://a:1/v1, http://b:2/v1",
        "MIRRORAPI_IS_SAVE": "false",
        "MIRRORAPI_CONFIG": str(config),
    }
    settings = load_settings(environ=environ)
    assert settings.port == 9002 and settings.model == "from-file" and settings.is_save is False
    assert settings.api_base == ["http://a:1/v1", "http://b:2/v1"]
    settings = load_settings(config, overrides={"port": "9003", "seed": "7"}, environ=environ)
    assert settings.port == 9003 and settings.seed == 7


def a_model_folder(tmp_path: Path, record: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / TRAINING_FILE).write_text(json.dumps(record), encoding="utf-8")
    return folder


def test_a_shipped_model_s_folder_is_served_as_its_record_says(tmp_path):
    """The documented command (serving/config_mirrorapi.yml, `--model` the folder `mirrorapi models get` wrote)
    serves the shipped simulator with the prompt and decoding settings its record names, not the defaults of a
    model trained on none of them."""
    folder = tmp_path / "smollm2-135m-mirrorapi-simulator"
    folder.mkdir()
    shutil.copy(shipped.ADAPTERS_DIR / folder.name / TRAINING_FILE, folder)
    named = json.loads((folder / TRAINING_FILE).read_text())["server_settings"]
    config = REPO / "serving" / "config_mirrorapi.yml"
    default = load_settings(config, environ={})
    settings = load_settings(config, overrides={"model": str(folder)}, environ={})
    for key, value in named.items():
        assert getattr(settings, key) == value, key
    differ = [key for key in named if getattr(default, key) != named[key]]
    assert {"prompt_format", "few_shot", "max_tokens", "few_shot_response_chars"} <= set(differ)
    # where it listens, stores and finds its tools are the config's
    assert (settings.port, settings.cache_path, settings.tools_folder) == (
        default.port,
        default.cache_path,
        default.tools_folder,
    )


def test_what_the_user_gives_wins_over_the_record(tmp_path):
    folder = a_model_folder(
        tmp_path,
        {
            "kind": "simulator",
            "server_settings": {
                "prompt_format": "mirrorapi-v2",
                "few_shot": 1,
                "max_tokens": 576,
                "few_shot_ties": "median",
                "port": 1,  # not a record's to set
                "cache_path": "/elsewhere.sqlite",
            },
        },
    )
    config = write(tmp_path / "c.yml", f"tools_folder: {SAMPLE_TOOLS}\nmodel: {folder}\nfew_shot: 3\n")
    settings = load_settings(config, overrides={"max_tokens": "100"}, environ={"MIRRORAPI_FEW_SHOT_TIES": "shortest"})
    assert settings.prompt_format == "mirrorapi-v2"  # the record's: nothing else gave one
    assert (settings.few_shot, settings.max_tokens, settings.few_shot_ties) == (3, 100, "shortest")
    assert settings.port == 8080 and str(settings.cache_path) != "/elsewhere.sqlite"  # not the record's
    off = load_settings(config, overrides={"model_settings": "off"}, environ={})
    assert (off.prompt_format, off.max_tokens, off.few_shot_ties) == ("mirrorapi-v1", 1024, "shortest")


def test_a_record_without_server_settings_gives_its_training_data_s_prompts(tmp_path):
    # training/sft.py's record: the SFT set's options; built with session history, its format is the session one,
    # and the server's prompt_format is the stateless one (a session's calls get the session format)
    options = {"prompt_format": "mirrorapi-session-v2", "few_shot": 1, "few_shot_response_chars": 600, "history": 8}
    folder = a_model_folder(tmp_path, {"kind": "simulator", "dataset_stats": {"options": options}})
    settings = load_settings(overrides={"tools_folder": [str(SAMPLE_TOOLS)], "model": str(folder)}, environ={})
    assert (settings.prompt_format, settings.few_shot, settings.few_shot_response_chars) == ("mirrorapi-v2", 1, 600)
    assert settings.session_history == 8


@pytest.mark.parametrize("model", ["mirrorapi", "mirrorapi/models", "/nonexistent/folder"])
def test_a_model_name_or_a_folder_without_a_record_keeps_the_defaults(model):
    settings = load_settings(overrides={"tools_folder": [str(SAMPLE_TOOLS)], "model": model}, environ={})
    assert (settings.prompt_format, settings.few_shot, settings.max_tokens) == ("mirrorapi-v1", 0, 1024)


@pytest.mark.parametrize(
    "text, message",
    [
        ("tool_folder: x\n", r"unknown key 'tool_folder' \(did you mean 'tools_folder'\?\)"),
        ("port: eighty\n", "port: Input should be a valid integer"),
        ("is_save: maybe\n", "is_save: Input should be a valid boolean"),
        ("mode: record\n", "mode: Input should be 'simulate' or 'replay'"),
        ("tools_folder: ./nowhere\n", "tools_folder: .*nowhere does not exist"),
        ("port: [1\n", "is not valid YAML"),
        ("- a list\n", "expected a mapping"),
    ],
    ids=["unknown-key", "int", "bool", "choice", "missing-folder", "yaml", "not-a-mapping"],
)
def test_bad_config_is_one_clear_error(tmp_path, text, message):
    if "tools_folder" not in text and "-" not in text[:1]:
        text += f"tools_folder: {SAMPLE_TOOLS}\n"
    config = write(tmp_path / "bad.yml", text)
    with pytest.raises(ConfigError, match=message) as err:
        load_settings(config, environ={})
    assert "\n" not in str(err.value)


def test_a_bad_value_is_named_as_its_source_gave_it(tmp_path):
    config = write(tmp_path / "good.yml", f"tools_folder: {SAMPLE_TOOLS}\n")
    with pytest.raises(ConfigError) as flag:
        load_settings(config, overrides={"engine_timeout": -2.5}, environ={})
    with pytest.raises(ConfigError) as variable:
        load_settings(config, environ={"MIRRORAPI_ENGINE_TIMEOUT": "-2.5"})
    # Each names the setting as its source spells it, the bound (engine_timeout: Field(gt=0)) and the value given;
    # the words between are pydantic's, not asserted.
    for error, name in ((flag.value, "--engine-timeout"), (variable.value, "MIRRORAPI_ENGINE_TIMEOUT")):
        message = str(error)
        assert message.startswith(f"settings: {name}: ") and "-2.5" in message, message
        assert re.search(r"(?<![\w.-])0(?![\w.])", message.replace("-2.5", "")), message


def test_a_config_file_that_is_not_utf8_is_one_clear_error(tmp_path):
    config = tmp_path / "latin1.yml"
    config.write_bytes(f"tools_folder: {SAMPLE_TOOLS}\nmodel: caf\xe9\n".encode("latin-1"))  # saved as Latin-1
    with pytest.raises(ConfigError, match="is not UTF-8 text") as err:
        load_settings(config, environ={})
    assert "\n" not in str(err.value)


def test_serve_command_exits_2_with_one_line(tmp_path, capsys):
    config = write(tmp_path / "bad.yml", f"tools_folder: {SAMPLE_TOOLS}\nport: eighty\n")
    assert mirrorapi_main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mirrorapi serve: error: config ") and "port" in err


def test_server_script_bad_config_exits_2_before_serving(tmp_path):
    config = write(tmp_path / "bad.yml", "tools_folder: ./missing-tools\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(config), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"main_mirrorapi.py: error: config {config}: tools_folder: {tmp_path / 'missing-tools'} does not exist"
    ]


def test_settings_only_the_start_can_check_are_one_line_and_exit_2(tmp_path, capsys):
    """A tools folder without a doc (one level too high, or empty: every call was an unknown API while /health said
    ok) and a request log that cannot be opened (a traceback): refused as the server starts, in one line."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "high" / "tools" / "Data").mkdir(parents=True)
    (tmp_path / "high" / "tools" / "Data" / "x.json").write_text('{"tool_name": "X", "api_list": []}')
    (tmp_path / "a-file").write_text("")
    base = ["serve", "--mode", "replay", "--cache-path", str(tmp_path / "c.sqlite"), "--port", "1"]
    for flags, says in (
        (["--tools-folder", str(tmp_path / "empty")], f"tools folder {tmp_path / 'empty'} holds no <Category>/"),
        (["--tools-folder", str(tmp_path / "high")], f"did you mean {tmp_path / 'high' / 'tools'}?"),
        (["--tools-folder", str(tmp_path / "high" / "tools")], f"tools_folder: no API doc in {tmp_path / 'high'}"),
        (
            ["--tools-folder", str(SAMPLE_TOOLS), "--log-file", str(tmp_path / "a-file" / "requests.jsonl")],
            f"log_file: cannot open {tmp_path / 'a-file' / 'requests.jsonl'} to append to",
        ),
    ):
        assert mirrorapi_main([*base, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mirrorapi serve: error: ") and says in err[0], err


def test_server_script_help_lists_every_setting():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for flag in ("--config", "--tools-folder", "--cache-path", "--api-base", "--model", "--port", "--host", "--mode"):
        assert flag in done.stdout


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"system_prompt_file": "empty.txt", "prompt_format": "stabletoolbench"}, "empty.txt is empty"),
        ({"system_prompt_file": "latin1.txt", "prompt_format": "stabletoolbench"}, "latin1.txt is not UTF-8 text"),
        ({"log_file": "."}, "is a folder, expected a file to append to"),
        # every write went to another connection's empty database ("no such table: entries")
        ({"cache_path": ":memory:"}, "is an in-memory database, which the cache cannot use"),
        ({"cache_path": ":memory:", "workers": 2}, "is an in-memory database, which the cache cannot use"),
        ({"api_base": "http://127.0.0.1:8001/v1,http://127.0.0.1:8002/v1"}, "holds a comma"),
        # aiohttp refuses a URL's credentials beside the bearer token: every miss failed, /health answered 500
        ({"api_base": ["http://127.0.0.1:8001/v1", "http://user:s3cret@127.0.0.1:8002/v1"]}, "user:password@"),
        ({"server_api_key": "  "}, "a blank key"),  # turned the key check off, silently
    ],
)
def test_settings_that_would_fail_later_or_quietly_are_refused_at_start(tmp_path, monkeypatch, given, message):
    """Each once started: an empty or Latin-1 system prompt failed every cache miss as an internal error, a folder
    as the request log was a traceback, workers on an in-memory cache each started empty (every import lost), and a
    comma list as one replica's URL was one unreachable engine."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "empty.txt", " \n")
    (tmp_path / "latin1.txt").write_bytes("Vous simulez une API, café compris.".encode("latin-1"))
    with pytest.raises(ConfigError, match=message) as refused:
        load_settings(overrides={"tools_folder": [str(SAMPLE_TOOLS)], **given}, environ={})
    assert "\n" not in str(refused.value) and "s3cret" not in str(refused.value)


def test_lists_flags_and_empty_variables_mean_what_they_say(tmp_path):
    """A list's flag given twice adds to it (the second replaced the first: a replica silently dropped); a variable
    set to nothing is unset (`MIRRORAPI_LOG_FILE=` was the working folder); a session format names its pair (calls
    outside a session are asked in the stateless format, as the data builder renders them)."""
    import argparse

    from mirrorapi.serving.config import add_server_arguments, settings_from_args

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_server_arguments(parser)
    args = parser.parse_args(
        ["--tools-folder", str(SAMPLE_TOOLS), "--api-base", "http://a:1/v1", "--api-base", "http://b:2/v1"]
    )
    assert settings_from_args(args, environ={"MIRRORAPI_LOG_FILE": ""}).api_base == ["http://a:1/v1", "http://b:2/v1"]
    assert settings_from_args(args, environ={"MIRRORAPI_LOG_FILE": ""}).log_file is None
    session = load_settings(overrides={"tools_folder": [str(SAMPLE_TOOLS)], "prompt_format": "mirrorapi-session-v2"})
    assert session.prompt_format == "mirrorapi-v2"


def test_the_start_up_line_shows_a_database_url_without_its_password():
    from mirrorapi.serving.app import without_password

    assert (
        without_password("postgresql://bench:s3cret@db.example:5432/cache")
        == "postgresql://bench:***@db.example:5432/cache"
    )
    assert without_password("postgresql://bench@db/cache?password=s3cret&sslmode=require") == (
        "postgresql://bench@db/cache?password=***&sslmode=require"
    )
    assert without_password("postgresql:///cache") == "postgresql:///cache"


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:s3cretpw@[::1/db", "postgresql://u:s3cret%zzpw@127.0.0.1:5/db", "postgresql://u:s3cretpw@h:x/d"],
)
def test_a_malformed_cache_url_is_one_line_that_never_shows_its_password(url, tmp_path, capsys):
    """libpq's message quoted the URL's unreadable part (`invalid percent-encoded token: "s3cret%zzpw"`), and the
    start-up line's password masking crashed `serve` with a traceback on an unclosed IPv6 bracket (audit of
    2026-12-01). Both say it in one line, without the password."""
    assert mirrorapi_main(["cache", "stats", "--cache", url]) == 2
    stats = capsys.readouterr().err
    argv = ["serve", "--tools-folder", str(SAMPLE_TOOLS), "--mode", "replay", "--cache-url", url, "--port", "0"]
    assert mirrorapi_main(argv) == 2
    served = capsys.readouterr().err
    for said in (stats, served):
        assert "s3cret" not in said and len(said.strip().splitlines()) == 1, said
        assert "cache_url is not a PostgreSQL URL" in said or "h:x" in url, said


def test_a_port_in_use_or_an_address_not_of_this_machine_is_one_line_before_anything_is_built(tmp_path, capsys):
    """A second server on a taken port started, built its app (a cache folder's import first, when given) and then
    exited 3 with uvicorn's error among the INFO lines of its start-up and shutdown. Now: one line, status 2, and no
    cache file made."""
    import socket

    cache = tmp_path / "c.sqlite"
    base = ["serve", "--tools-folder", str(SAMPLE_TOOLS), "--mode", "replay", "--cache-path", str(cache)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert mirrorapi_main([*base, "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"mirrorapi serve: error: port: 127.0.0.1:{port} is in use (another server, or this one started twice): "
        "stop it or choose another --port"
    ]
    # 192.0.2.1: TEST-NET-1 (RFC 5737), no machine's own address; `.invalid` names never resolve (RFC 2606).
    for host, says in (("192.0.2.1", "is not an address of this machine"), ("no-such-host.invalid", "cannot listen")):
        assert mirrorapi_main([*base, "--host", host, "--port", "8080"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mirrorapi serve: error: host: ") and says in err[0], err
    assert not cache.exists()


def test_a_judge_s_folder_given_as_the_simulator_is_refused(tmp_path):
    """A judge's record says 16 tokens: served as the simulator, every miss got a cut verdict, cached as the API's
    answer. `model_settings: off` (the record not read) still serves the folder as the user asks."""
    judge = a_model_folder(tmp_path, {"kind": "judge", "server_settings": {"max_tokens": 16}})
    base = {"tools_folder": [str(SAMPLE_TOOLS)], "model": str(judge)}
    with pytest.raises(ConfigError, match=r"model: .* is a judge \(its mirrorapi_training.json says kind 'judge'\)"):
        load_settings(overrides=base, environ={})
    assert load_settings(overrides={**base, "model_settings": "off"}, environ={}).max_tokens == 1024


def test_the_start_up_line_lists_only_what_was_given():
    """`allowed_hosts` (a list whose default is made by a factory) was listed as given, `[]`, on every start."""
    settings = load_settings(overrides={"tools_folder": [str(SAMPLE_TOOLS)]}, environ={})
    assert settings.non_default() == {"tools_folder": [str(SAMPLE_TOOLS)]}
    given = load_settings(overrides={"tools_folder": [str(SAMPLE_TOOLS)], "allowed_hosts": ["a.example"]}, environ={})
    assert given.non_default()["allowed_hosts"] == ["a.example"]


def test_a_flag_clears_a_number_the_file_gave_with_none(tmp_path):
    """`--seed none` was refused by argparse ("invalid int value"), so a flag could not clear a file's seed, where the
    variable MIRRORAPI_SEED=none could; a number is still checked as one."""
    import argparse

    from mirrorapi.serving.config import add_server_arguments, settings_from_args

    config = write(tmp_path / "c.yml", f"tools_folder: {SAMPLE_TOOLS}\nseed: 5\n")
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_server_arguments(parser)
    assert settings_from_args(parser.parse_args(["--config", str(config)]), environ={}).seed == 5
    assert settings_from_args(parser.parse_args(["--config", str(config), "--seed", "none"]), environ={}).seed is None
    assert (
        settings_from_args(parser.parse_args(["--config", str(config)]), environ={"MIRRORAPI_SEED": "null"}).seed
        is None
    )
    assert settings_from_args(parser.parse_args(["--config", str(config), "--seed", "7"]), environ={}).seed == 7
    with pytest.raises(SystemExit):
        parser.parse_args(["--config", str(config), "--seed", "seven"])


@pytest.mark.parametrize("line", ["server_api_key: 123456789", "api_key: {k: ENGINESECRET}", "server_api_key: [1, 2]"])
def test_a_secret_of_the_wrong_type_is_not_echoed_in_the_error(tmp_path, line):
    """`server_api_key: 123456789` (a key YAML reads as a number) was refused as "Input should be a valid string
    (got 123456789)": the key, in the error, in a terminal's scroll-back or a CI log (audit of 2026-12-01)."""
    config = write(tmp_path / "c.yml", f"tools_folder: {SAMPLE_TOOLS}\n{line}\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(config, environ={})
    message = str(refused.value)
    assert "the value is not shown" in message and "123456789" not in message and "ENGINESECRET" not in message
