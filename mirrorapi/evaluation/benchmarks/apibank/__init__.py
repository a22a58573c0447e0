"""API-Bank level-1 (Call) and level-2 (Retrieve+Call): API-call accuracy and response ROUGE-L on our virtual server.

API-Bank (Li et al., EMNLP 2023, arXiv 2304.08244; AlibabaResearch/DAMO-ConvAI `api-bank/`, read at commit
5c38bb7d1d78c7a7f12aa415d620d6305dbe2078) evaluates a model on annotated dialogues. Every API turn of a dialogue
gives two samples (its `evaluator.py`, `Sample.from_chat_history`):
- a *call* sample: the history before the API turn; the model writes `[ApiName(key='value', ...)]`; the call is
  executed and counted correct when the API's own `check_api_call_correctness` accepts the executed result against
  the annotated one (`rules.RULES` restates those per-API rules);
- a *response* sample: the history up to and including the API turn; the model writes the AI's next utterance,
  scored by ROUGE-L F against the annotated one. When the next turn is itself an API call, API-Bank counts it as
  one more call sample (the same history and the same annotated call, asked twice); we do the same.
Level 1 shows the model the descriptions of the dialogue's APIs; level 2 only the ToolSearcher's.

What differs from API-Bank, and why:
- The call is executed on OUR virtual server (`POST /virtual`, tools `data/samples/tools/APIBank`), not on API-Bank's
  Python classes: API-Bank's recorded results are imported into the server's cache (`write_recorded_pairs`), so an
  annotated call gets its recorded answer and any other call gets the simulator's (or, in replay mode, an error).
- ToolSearcher is API-Bank's retriever over its own tool list (sentence-transformers), not a tool the simulator
  serves: its calls are answered from the recorded ToolSearcher results of the dialogues (same arguments, same
  answer); a query the recordings do not hold gets no output and an exception, i.e. counts as wrong.
- The server speaks JSON text: a recorded output and a served one are both read back with `json.loads` where they
  are JSON text, so `"success"` and `success` compare equal, as do a dict and its JSON.
- ROUGE-L is rouge-score's `rougeL` F-measure (the project's ROUGE library), which lower-cases and keeps only
  letters and digits of a-z and 0-9; API-Bank used the `rouge` package, whose tokenizer keeps case and punctuation, so
  values differ, most where case does: on the 478 response samples, the reference lower-cased scores 100.0 here and
  78.95 there, the AI turn before the call 13.40 here and 11.95 there.

Modules, by job: `samples` (the dialogues, their call and response samples, the prompts), `rules` (parsing a
predicted call, typing its arguments, the per-API correctness rules), `execution` (running a call on the virtual
server; the recorded calls as cache pairs), `scoring` (the run, the summary, the report, the command line).
"""

from mirrorapi.evaluation.benchmarks.apibank.execution import (
    VirtualApiBank,
    json_value,
    recorded_results,
    tools_of,
    truth_result,
    write_recorded_pairs,
)
from mirrorapi.evaluation.benchmarks.apibank.rules import RULES, call_is_correct, parse_call, typed_arguments
from mirrorapi.evaluation.benchmarks.apibank.samples import (
    CALL_INSTRUCTION,
    CATEGORY,
    LEVEL_NAMES,
    LEVELS,
    RESPONSE_INSTRUCTION,
    TOOL_SEARCHER,
    Sample,
    build_messages,
    call_text,
    load_descriptions,
    load_dialogues,
    parameter_types,
    samples_of,
)
from mirrorapi.evaluation.benchmarks.apibank.scoring import (
    Settings,
    evaluate,
    parser,
    report_data,
    report_lines,
    report_markdown,
    report_section,
    rouge_l,
    settings_from,
    summarize,
    write_pairs_from,
    write_report,
)

__all__ = [
    "CALL_INSTRUCTION",
    "CATEGORY",
    "LEVELS",
    "LEVEL_NAMES",
    "RESPONSE_INSTRUCTION",
    "RULES",
    "TOOL_SEARCHER",
    "Sample",
    "Settings",
    "VirtualApiBank",
    "build_messages",
    "call_is_correct",
    "call_text",
    "evaluate",
    "json_value",
    "load_descriptions",
    "load_dialogues",
    "parameter_types",
    "parse_call",
    "parser",
    "recorded_results",
    "report_data",
    "report_lines",
    "report_markdown",
    "report_section",
    "rouge_l",
    "samples_of",
    "settings_from",
    "summarize",
    "tools_of",
    "truth_result",
    "typed_arguments",
    "write_pairs_from",
    "write_recorded_pairs",
    "write_report",
]
