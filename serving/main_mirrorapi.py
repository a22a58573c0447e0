"""The virtual API server: StableToolBench's `POST /virtual`, answered from a response cache, then
by a simulator model behind an OpenAI-compatible engine (`vllm serve`, `transformers serve`).

    python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml
    python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml --port 8081 --mode replay

Same as `mirrorapi serve ...`. Every key of the config file is also a flag (`--tools-folder A B`) and
an environment variable (`MIRRORAPI_TOOLS_FOLDER=A,B`); see `--help` and mirrorapi/serving/config.py.
Point StableToolBench's agents at it: `SERVICE_URL=http://127.0.0.1:8080/virtual`.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.serving.commands import SERVE


def main(argv: list[str] | None = None) -> int:
    return run_script(SERVE, argv, __doc__, "main_mirrorapi.py")


if __name__ == "__main__":
    sys.exit(main())
