"""The virtual API server: StableToolBench's `POST /virtual`, answered from a response cache, then
by a simulator model behind an OpenAI-compatible engine (`vllm serve`, `transformers serve`).

    python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml
    python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml --port 8081 --mode replay

Same as `mirrorapi serve ...`. Every key of the config file is also a flag (`--tools-folder A B`) and
an environment variable (`MIRRORAPI_TOOLS_FOLDER=A,B`); see `--help` and mirrorapi/serving/config.py.
Point StableToolBench's agents at it: `SERVICE_URL=http://127.0.0.1:8080/virtual`.
"""

import argparse
import sys

from mirrorapi.serving.app import STARTUP_ERRORS, serve
from mirrorapi.serving.config import add_server_arguments, settings_from_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="main_mirrorapi.py", description=__doc__.splitlines()[0], allow_abbrev=False)
    args = add_server_arguments(parser).parse_args(argv)
    try:
        serve(settings_from_args(args))
    except STARTUP_ERRORS as exc:  # a user's mistake: one line, exit status 2
        print(f"main_mirrorapi.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
