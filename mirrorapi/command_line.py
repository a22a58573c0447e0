"""How every mirrorapi command is built: settings flags derived from settings models, and subcommands.

Settings are declared once, as fields of a pydantic model or pydantic dataclass (`ServerSettings`,
`AgentSettings`, `JudgeSettings`, `FidelitySettings`, API-Bank's `Settings`) with their default, constraints and
description. From those fields come their command-line flags (`add_settings_arguments`), their environment
variables (`environment_values`) and their YAML keys (`read_yaml_settings`); a field says how it is spelt on the
command line, when its name is not enough, with `Annotated[..., Flag(...)]`.

Why not pydantic-settings (tried, 2.16.3, on `ServerSettings`): its command-line source refuses
`--tools-folder A B` (a list there is `--tools-folder A --tools-folder B`, `A,B` or JSON) and has no second
spelling such as `--tools_folder`, both of which StableToolBench's users and our docs write; its environment source
reads lists as JSON unless every list field is marked `NoDecode`; its YAML source answers a file that is not a
mapping with a bare `ValueError` and reads relative paths from the working directory, not from the file; and a
`BaseSettings` model reads the environment whenever it is built, so the demo, the harnesses and the tests, which
build settings in code, would silently take a user's `MIRRORAPI_PORT`. Keeping our rules, all it would do is
layer three dicts. So flags are derived here from the fields, as vLLM (`EngineArgs.add_cli_args`) and TRL
(`HfArgumentParser`) derive theirs from dataclasses.

A `Command` is one subcommand: its flags and the function that runs it. Each stage lists its commands
and registers them under `mirrorapi` (`register(sub)` in its `commands.py`); the entry scripts
(`eval/fac.py`, `data/build_simulator_sft.py`, `serving/main_mirrorapi.py`, ...) run one `Command`
alone with `run_script`, so a script and its `mirrorapi` subcommand take the same flags and fail alike.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo


class SettingsError(ValueError):
    """A setting that cannot work; the message is one line that says what to change."""


# ------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Flag:
    """How a settings field is spelt on the command line, where its name is not enough."""

    name: str | None = None  # the flag without dashes, e.g. "base-url" for the field base_urls
    metavar: str | None = None
    choices: tuple | None = None  # for a str field whose values a check of the model's own refuses


def settings_fields(model: type) -> dict[str, FieldInfo]:
    """The fields of a pydantic model or pydantic dataclass, in declaration order."""
    fields = getattr(model, "__pydantic_fields__", None)
    if fields is None:
        raise TypeError(f"{model.__name__} is not a pydantic model or pydantic dataclass")
    return fields


def _flag_of(field: FieldInfo) -> Flag:
    return next((m for m in field.metadata if isinstance(m, Flag)), Flag())


def _is_list(field: FieldInfo) -> bool:
    return typing.get_origin(field.annotation) in (list, tuple)


def _value_type(field: FieldInfo) -> Any:
    """The type of one value: `int` for `int | None` and for `list[int]`."""
    annotation: Any = field.annotation
    if _is_list(field):
        annotation = (typing.get_args(annotation) or (None,))[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
    return annotation


def _choices(field: FieldInfo) -> list | None:
    flag_choices = _flag_of(field).choices
    if flag_choices:
        return list(flag_choices)
    annotation = _value_type(field)
    return list(typing.get_args(annotation)) if typing.get_origin(annotation) is typing.Literal else None


def _scalar_type(field: FieldInfo) -> Any:
    """int or float for a number field, so that argparse refuses `--port x` (other values: pydantic converts). A number
    whose default is None also takes `none` or `null`, kept as text: the layer above reads it as "clear the value
    the file or the environment gave" (`--seed none`), as it reads the same word from the environment."""
    annotation = _value_type(field)
    if annotation not in (int, float):
        return None
    if field.default is not None:
        return annotation

    def number_or_none(text: str):
        return text if text.lower() in ("none", "null") else annotation(text)

    number_or_none.__name__ = annotation.__name__  # argparse's "invalid int value: 'x'"
    return number_or_none


def _default_text(field: FieldInfo, command_default: Any = None) -> str:
    default = command_default if command_default is not None else field.get_default(call_default_factory=True)
    if (field.is_required() and command_default is None) or default in (None, "", [], ()) or default is False:
        return ""
    shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
    return f"(default {shown})"


def _help(description: str, default: str) -> str:
    """The description with its default: "Seconds per call (default 120)."."""
    if not default:
        return description
    return f"{description[:-1]} {default}." if description.endswith(".") else f"{description} {default}".strip()


def flag_name(model: type, name: str, prefix: str = "") -> str:
    """`--<prefix><flag>` of one field (e.g. `--judge-base-url` for JudgeSettings.base_urls, prefix judge-)."""
    return "--" + prefix + (_flag_of(settings_fields(model)[name]).name or name.replace("_", "-"))


def add_settings_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type,
    prefix: str = "",
    exclude: Sequence[str] = (),
    required: bool = True,
    underscore_spelling: bool = False,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per field of `model`: `--<prefix><name>`, its help the field's description and default.

    Lists take several values, and their flag may be given again for more; a boolean that defaults to False is a
    switch; a Literal gives the choices. A flag not given is None in the namespace, so that the model's default (or
    the layer below it, a YAML file or the environment) applies: defaults are written once, in the model.
    `defaults`: where one command needs another default for a field (ToolEyes' judge writes five short lines), the
    value it takes there; the field is still declared once. `required=False` when the required fields may come from
    such a layer; `underscore_spelling` also accepts `--tools_folder` (StableToolBench's keys).
    """
    defaults = defaults or {}
    dest_prefix = prefix.replace("-", "_")
    for name, field in settings_fields(model).items():
        if name in exclude:
            continue
        flag = _flag_of(field)
        spelt = flag.name or name.replace("_", "-")
        flags = ["--" + prefix + spelt] + (["--" + prefix + name] if underscore_spelling and "_" in name else [])
        help_text = _help(field.description or "", _default_text(field, defaults.get(name)))
        if field.annotation is bool and field.default is False:
            parser.add_argument(*flags, dest=dest_prefix + name, action="store_true", default=None, help=help_text)
            continue
        listed = _is_list(field)
        parser.add_argument(
            *flags,
            dest=dest_prefix + name,
            # A list's flag given twice adds to it (`--api-base A --api-base B`; the second once replaced the first)
            action="extend" if listed and name not in defaults else "store",
            nargs="+" if listed else None,
            type=_scalar_type(field),
            choices=_choices(field),
            required=required and field.is_required() and name not in defaults,
            default=defaults.get(name),
            metavar=flag.metavar or (None if _choices(field) else spelt.replace("-", "_").upper()),
            help=help_text.replace("%", "%%"),
        )


def settings_values(args: argparse.Namespace, model: type, prefix: str = "") -> dict[str, Any]:
    """The settings given on the command line (the flags of `add_settings_arguments`), by field name."""
    dest_prefix = prefix.replace("-", "_")
    return {
        name: getattr(args, dest_prefix + name)
        for name in settings_fields(model)
        if getattr(args, dest_prefix + name, None) is not None
    }


def one_line(error: ValidationError, model: type, spell: Callable[[str], str] = str) -> str:
    """A pydantic ValidationError as one line; `spell` names a key as the user wrote it (a flag, a YAML key)."""
    fields, parts = settings_fields(model), []
    for item in error.errors():
        key = str(item["loc"][0]) if item["loc"] else ""
        shown = spell(key) if key in fields else key or "settings"
        if item["type"] == "extra_forbidden":
            close = difflib.get_close_matches(key, fields, n=1)
            parts.append(f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        elif item["type"] == "missing":
            parts.append(f"{shown} is required")
        elif item["type"] in ("value_error", "assertion_error"):
            parts.append(str(item["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, "))
        elif _SECRET.search(key):  # its value is not echoed: a key YAML read as a number is still the key
            parts.append(f"{shown}: {item['msg']} (the value is not shown)")
        else:
            parts.append(f"{shown}: {item['msg']} (got {item.get('input')!r})")
    return "; ".join(parts)


# Settings whose values a message never shows: `api_key`, `server_api_key`, a `*_token`, `cache_url` (not
# `max_tokens`).
_SECRET = re.compile(r"(?:^|_)(?:key|token|password|secret)$|^cache_url$")


def cleared(values: Mapping[str, Any], model: type) -> dict[str, Any]:
    """`values` with the words `none` and `null` read as None for a field whose default is None: how a flag or an
    environment variable clears what a layer below gave (`--seed none` over a config file's seed)."""
    fields = settings_fields(model)
    return {
        k: None
        if isinstance(v, str) and v.lower() in ("null", "none") and k in fields and fields[k].default is None
        else v
        for k, v in values.items()
    }


def settings_from_args(args: argparse.Namespace, model: type, /, prefix: str = "", **given: Any):
    """An instance of `model` from its flags (and `given` values, which win); SettingsError in one line."""
    try:
        return model(**cleared({**settings_values(args, model, prefix), **given}, model))
    except ValidationError as exc:
        raise SettingsError(one_line(exc, model, lambda name: flag_name(model, name, prefix))) from None


def environment_values(model: type, env_prefix: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`<env_prefix><FIELD>` for every field of `model` (strings, lists comma-separated; pydantic converts). A
    variable set to nothing (`MIRRORAPI_LOG_FILE=`) is unset, as a shell's `VAR= command` means: as a path it
    would be the working folder."""
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for name, field in settings_fields(model).items():
        value = environ.get(env_prefix + name.upper())
        if value is not None and value.strip():
            out[name] = [v.strip() for v in value.split(",") if v.strip()] if _is_list(field) else value
    return out


def path_fields(model: type) -> set[str]:
    """The fields that hold paths (a YAML file's relative paths are taken from its folder)."""
    return {name for name, field in settings_fields(model).items() if "Path" in str(field.annotation)}


def read_yaml_settings(path: str | os.PathLike, model: type) -> dict[str, Any]:
    """The keys of a YAML settings file, its relative paths made relative to its folder; SettingsError."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(f"config file {path} is not UTF-8 text (byte {exc.start + 1:,})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise SettingsError(f"config file {path} is not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path}: expected a mapping of keys to values, got {type(data).__name__}")
    base, paths = path.resolve().parent, path_fields(model)

    def fix(value):
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            return os.path.normpath(base / value)
        return os.path.expanduser(value) if isinstance(value, str) else value

    return {
        k: ([fix(v) for v in val] if isinstance(val, list) else fix(val)) if k in paths else val
        for k, val in data.items()
    }


# ------------------------------------------------------------------------------------------ commands
def print_json(obj) -> None:
    print(json.dumps(obj, ensure_ascii=False, indent=2, default=str))


@dataclass(frozen=True)
class Command:
    """One subcommand: its flags, the function that runs it, and the errors that are the user's to fix
    (printed as one line `<prog>: error: <message>`, exit status 2, never a traceback)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], object]
    run: Callable[[argparse.Namespace], int]
    errors: tuple[type[BaseException], ...] = ()
    passthrough: bool = False  # the command parses its own arguments (args.passthrough), e.g. TRL's parser
    description: str = ""  # shown by `--help` when longer than `help`, which lists the command


def add_command(sub, command: Command) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        command.name,
        help=command.help,
        description=command.description or command.help,
        allow_abbrev=False,
        add_help=not command.passthrough,
    )
    command.add_arguments(parser)
    # errors name the command as called (`mirrorapi eval fac: error: ...`), as argparse's own do
    parser.set_defaults(mirrorapi_command=command, mirrorapi_prog=parser.prog, mirrorapi_parser=parser)
    return parser


def add_group(sub, name: str, help: str, commands: Sequence[Command]) -> None:
    """`mirrorapi <name> <command> ...`: a subcommand group of one stage."""
    group = sub.add_parser(name, help=help, description=help, allow_abbrev=False)
    group_sub = group.add_subparsers(dest=f"{name}_command", required=True)
    for command in commands:
        add_command(group_sub, command)


def out_folder_problem(out: str | os.PathLike) -> str | None:
    """Why `--out` cannot be a folder a command makes or fills (None: it can), found before the work rather than
    after it all: a file, a path under a file, or a place this user cannot write."""
    if Path(out).exists() and not Path(out).is_dir():
        return f"--out {out} is a file, not a folder"
    existing = Path(out).absolute()
    while not existing.exists():  # the folder the command would make it in (nothing is made here)
        existing = existing.parent
    if not existing.is_dir():
        return f"--out {out} cannot be made: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out} cannot be made or written: {existing} is not writable"
    return None


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None, prog: str) -> int:
    """Parse `argv` and run the command it names (`args.prog` tells the command how it was called)."""
    args, rest = parser.parse_known_args(argv)
    command: Command = args.mirrorapi_command
    if rest and not command.passthrough:
        # by the command's own parser: its usage and `mirrorapi cache stats: error:`, not the top level's
        getattr(args, "mirrorapi_parser", parser).error(f"unrecognized arguments: {' '.join(rest)}")
    args.passthrough = rest
    return _run(command, args, prog)


def _run(command: Command, args: argparse.Namespace, prog: str) -> int:
    prog = args.prog = getattr(args, "mirrorapi_prog", prog)
    try:
        status = command.run(args)
        sys.stdout.flush()  # here, where a reader gone is caught, not at the interpreter's exit
        return status
    except command.errors as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, and the shell's status for SIGINT, not a traceback
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout has gone (`| head -1`): quiet, as a program killed by SIGPIPE is, and stdout pointed
        # at /dev/null so that the interpreter's own flush at exit raises nothing more (Python's docs, "Note on
        # SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def run_script(command: Command, argv: Sequence[str] | None, usage: str, prog: str) -> int:
    """Run one command as an entry script: `--help` shows the script's docstring (`usage`) too. A passthrough
    command gets the arguments as they are (its own parser is the only one that reads them)."""
    if command.passthrough:
        args = argparse.Namespace(mirrorapi_command=command)
        args.passthrough = list(sys.argv[1:] if argv is None else argv)
        return _run(command, args, prog)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=usage.splitlines()[0],
        epilog=usage,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    command.add_arguments(parser)
    parser.set_defaults(mirrorapi_command=command)
    return run_parsed(parser, argv, prog)
