"""The simulator's answers to a sample of held-out records (`scripts/train_shipped_models.py`'s train and answer
stages): greedy from an adapter, or asked of a served simulator as the virtual server asks it."""

from __future__ import annotations

import json
import lzma
import random
import time
from pathlib import Path

from shipped_steps.common import base_model, load_trained, log, machine
from shipped_steps.results import Results

HELD_OUT_SPLITS = ("test_id", "test_ood")


def held_out_sample(
    dataset_path: Path, per_stratum: int, seed: int = 0, splits: tuple[str, ...] = HELD_OUT_SPLITS
) -> list[dict]:
    """Held-out records to generate for: of each (split, source, prompt format), up to `per_stratum`, taken in an
    order that visits every stratum in turn (so a run stopped by its time limit still has every source)."""
    from datasets import load_from_disk

    dataset = load_from_disk(str(dataset_path))
    strata: dict[tuple, list[dict]] = {}
    for split in splits:
        if split not in dataset:
            continue
        for record in dataset[split]:
            stratum = strata.setdefault((split, record["source"], record["prompt_format"]), [])
            stratum.append({**record, "split": split})
    rng = random.Random(seed)
    for records in strata.values():
        rng.shuffle(records)
    chosen = [records[:per_stratum] for _, records in sorted(strata.items())]
    return [r for group in zip_longest_all(chosen) for r in group]


def zip_longest_all(groups: list[list[dict]]) -> list[list[dict]]:
    rounds = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(rounds)]


def generate(
    base: Path, adapter: Path, records: list[dict], device: str, seconds: float, max_new_tokens: int, batch_size: int
) -> list[dict]:
    """Greedy answers of the trained simulator to `records`' prompts, in batches of similar prompt lengths, until
    `seconds` have passed."""
    import torch

    tokenizer, model = load_trained(base, adapter, device)
    model = model.merge_and_unload()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in records]
    batches = [list(range(i, min(i + batch_size, len(records)))) for i in range(0, len(records), batch_size)]
    out, started = [], time.perf_counter()
    for batch in batches:
        if time.perf_counter() - started > seconds:
            log(f"generation: time limit after {len(out)} of {len(records)} answers")
            break
        encoded = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False).to(
            device
        )
        with torch.inference_mode():
            generated = model.generate(
                **encoded,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        for i, row in zip(batch, generated[:, encoded.input_ids.shape[1] :], strict=True):
            new_tokens = int((row != tokenizer.pad_token_id).sum())
            out.append(
                answer_row(records[i], tokenizer.decode(row, skip_special_tokens=True), new_tokens, max_new_tokens)
            )
    return out


def answer_row(record: dict, text: str, new_tokens: int, max_new_tokens: int) -> dict:
    """One line of generations.jsonl.xz: the record's call, its real answer as trained, the simulator's text."""
    keys = ("split", "source", "episode", "step", "category", "tool", "api", "arguments", "prompt_format", "kind")
    return (
        {key: record[key] for key in keys}
        | {
            "target": record["completion"][0]["content"],
            "generated": text,
            "cut": new_tokens >= max_new_tokens,  # stopped by the limit, not by the model
        }
        | ({"history_twin": True} if record.get("history_twin") else {})
    )


def history_twins(dataset_path: Path, records: list[dict]) -> list[dict]:
    """For each session record of `records`, the same call asked without its history: its split's stateless record
    of that call (the data build's --stateless-too), its prompt as built, but carrying the session record's
    source, episode, step and real answer, so that the score stage scores both against the same answer. A
    session record whose call has no stateless record (a build without --stateless-too) has no twin."""
    from datasets import load_from_disk

    from mirrorapi.prompts.simulator_formats import SESSION_FORMATS

    def call(record: dict, split: str) -> tuple:
        return (split, record["category"], record["tool"], record["api"], record["arguments"])

    dataset = load_from_disk(str(dataset_path))
    stateless: dict[tuple, dict] = {}
    for split in sorted({r["split"] for r in records if r["prompt_format"] in SESSION_FORMATS}):
        for record in dataset[split]:
            if record["prompt_format"] not in SESSION_FORMATS:
                stateless.setdefault(call(record, split), record)
    twins = []
    for record in records:
        twin = stateless.get(call(record, record["split"])) if record["prompt_format"] in SESSION_FORMATS else None
        if twin is not None:
            same_answer = {key: record[key] for key in ("split", "source", "episode", "step", "completion")}
            twins.append({**twin, **same_answer, "history_twin": True})
    return twins


def with_the_session_failure_rule(rows: list[dict], records: list[dict], rule: str) -> list[dict]:
    """`rows` (answers to `records`, in order, history twins among them) as a server with that
    `session_failure_rule` gives them (`mirrorapi.serving.handler`): a session answer that is a failure the rule
    checks (`related`: where none of the earlier calls its prompt shows is related to the call, `related_to_call`;
    `alone`: every one) is replaced by its history twin's answer, the same call asked alone, except under `alone`
    where that is a failure too. A replaced row says `asked_alone` and keeps its own answer as
    `session_generated`."""
    from mirrorapi.evaluation.fidelity.metrics import is_error
    from mirrorapi.prompts.simulator_formats import SESSION_FORMATS, related_to_call, shown_history
    from mirrorapi.prompts.simulator_output import parse_simulator_output

    def call(row: dict) -> tuple:
        return row["split"], row["source"], row["episode"], row["step"]

    def failure(text: str) -> bool:
        return is_error(parse_simulator_output(text)[0])

    alone = {call(row): row for row in rows if row.get("history_twin")}
    out = []
    for record, row in zip(records, rows, strict=True):
        twin = alone.get(call(row))
        if row["prompt_format"] in SESSION_FORMATS and not row.get("history_twin") and twin is not None:
            if rule == "alone":
                checked = failure(row["generated"]) and not failure(twin["generated"])
            else:
                arguments = json.loads(record["arguments"])
                shown = shown_history(record["prompt"])
                unrelated = not any(related_to_call(line, record["api"], arguments) for line in shown)
                checked = rule == "related" and failure(row["generated"]) and unrelated
            if checked:
                answered = {"generated": twin["generated"], "cut": twin["cut"], "session_generated": row["generated"]}
                row = row | answered | {"asked_alone": True}
        out.append(row)
    return out


def served_answers(
    engine: str, model: str, records: list[dict], tools: list[str], max_tokens: int, structured_output: bool
) -> list[dict]:
    """The answers of a simulator an OpenAI-compatible engine serves (llama.cpp, vLLM) to `records`, asked as the
    virtual server asks it: the record's own prompt (the server's, tests/data/test_few_shot_parity.py), temperature
    0, and with `structured_output` (the server's default) its `response_format` for the call's API. What a user's
    server gets; `generate` sends the prompts bare to transformers, and a grammar changes some answers.

    An answer cut at the limit is asked once more as the server asks it (`ask_engine`, the server's default
    `second_try_temperature`); the row's `second_try` says so ("kept", "cut again", "failed").

    A call that a server's default argument policy refuses (`missing_required: reject`: a call without a required
    argument) is answered as that server answers it, with the refusal and no engine call (`"answered_by":
    "server"`): a served simulator is never asked it."""
    import asyncio

    from mirrorapi.engine_client import EngineClient
    from mirrorapi.prompts.simulator_formats import stateless_format
    from mirrorapi.records import observation_json
    from mirrorapi.serving.config import ServerSettings
    from mirrorapi.serving.simulator import ask_engine, response_format
    from mirrorapi.tools import ArgumentError, ToolRegistry, check_arguments

    registry = ToolRegistry.load(tools)
    policy = [ServerSettings.model_fields[key].default for key in ("missing_required", "unknown_arguments")]
    second_try_temperature = ServerSettings.model_fields["second_try_temperature"].default

    async def ask_each() -> list[dict]:
        client = EngineClient(engine, model, timeout=600, retries=0)
        out, started = [], time.perf_counter()
        try:
            for n, record in enumerate(records, 1):
                doc = registry.get(record["category"], record["tool"], record["api"])
                try:
                    check_arguments(doc, json.loads(record["arguments"]), *policy)
                except ArgumentError as refused:
                    out.append(answer_row(record, observation_json(str(refused), ""), 0, max_tokens))
                    out[-1]["answered_by"] = "server"
                    continue
                # the server's prompt_format is the stateless one; its calls in sessions get the same schema
                schema = response_format(doc, stateless_format(record["prompt_format"])) if structured_output else None
                completion, second_try = await ask_engine(
                    client,
                    record["prompt"],
                    schema,
                    temperature=0.0,
                    max_tokens=max_tokens,
                    seed=None,
                    second_try_temperature=second_try_temperature,
                )
                content = completion.message.get("content")
                text = content if isinstance(content, str) else ""
                out.append(answer_row(record, text, int(completion.usage.get("completion_tokens") or 0), max_tokens))
                if second_try:
                    out[-1]["second_try"] = second_try
                if n % 20 == 0:
                    log(f"served answers: {n} of {len(records)} ({time.perf_counter() - started:.0f} s)")
        finally:
            await client.aclose()
        return out

    return asyncio.run(ask_each())


def sampled_records(args, work: Path) -> list[dict]:
    """The held-out records the answer and decisions stages ask: the sample of `--splits`, then `--sources`,
    `--answers` and `--history-twins`."""
    records = held_out_sample(work / "data" / "simulator", args.per_stratum, splits=tuple(args.splits))
    if args.sources:  # after sampling, so that each kept record is the one a run without the filter asks
        records = [r for r in records if r["source"] in args.sources]
    records = records[: args.answers]
    if not records:
        raise SystemExit(
            f"no held-out records in {', '.join(args.splits)}"
            + (f" of {', '.join(args.sources)}" if args.sources else "")
            + ": build the data again (--stage data), or name a source its data holds"
        )
    if args.history_twins:  # after the sample, so that its answers stay those of a run without twins
        records += history_twins(work / "data" / "simulator", records)
    return records


def check_asked_as_served(engine_model: str, data: Path) -> None:
    """A served model's record names the prompts a server shows it (`serving_settings`: its examples' tie rule and
    sizes, its session history); the held-out records of `data` must have been built so, or their answers are
    not the server's. A name that is no model folder with a record is not checked."""
    from mirrorapi.models.catalogue import SETTINGS_OF_DATA_OPTIONS, read_training_record, serving_settings

    record = read_training_record(engine_model) if Path(engine_model).is_dir() else None
    if record is None:
        return
    served = serving_settings(record)
    options = json.loads((data / "stats.json").read_text(encoding="utf-8")).get("options") or {}
    differ = [
        f"{setting} {served[setting]!r} (the data: {options.get(option)!r})"
        for option, setting in SETTINGS_OF_DATA_OPTIONS.items()
        if setting in served and options.get(option) != served[setting]
    ]
    if differ:
        raise SystemExit(
            f"{engine_model} is served with {', '.join(differ)}: build the data stage with the matching flags "
            f"(--few-shot-ties, --few-shot-char-budget, --few-shot-response-chars, --history...), so that the "
            "held-out prompts are the server's"
        )


def answer_stage(args, work: Path) -> dict:
    """An adapter's greedy answers to the held-out sample, as the train stage writes them, without training: to
    compare adapters on the same records with the same generation settings."""
    started = time.perf_counter()
    if args.engine:  # before anything is asked
        check_asked_as_served(args.engine_model, work / "data" / "simulator")
    records = sampled_records(args, work)
    if args.engine:
        device = f"engine {args.engine}"
        generations = served_answers(
            args.engine, args.engine_model, records, args.tools, args.max_new_tokens, args.structured_output
        )
        generations = with_the_session_failure_rule(generations, records, args.session_failure_rule)
    else:
        device = machine()["device"]
        base = base_model(work, args.base, args.base_gguf)
        generations = generate(
            base, Path(args.adapter), records, device, args.generate_seconds, args.max_new_tokens, args.batch_size
        )
    out = Path(args.out or work / "answers")
    results = Results(out, args.pack)
    with lzma.open(out / "generations.jsonl.xz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in generations)
    results.landed()
    results.log_summary()
    return {
        "answers": len(generations),
        "sampled": len(records),
        "history_twins": sum(bool(row.get("history_twin")) for row in generations),
        "asked_alone": sum(bool(row.get("asked_alone")) for row in generations),
        "refused_by_the_server": sum(row.get("answered_by") == "server" for row in generations),
        "cut": sum(row["cut"] for row in generations),
        "second_tries": {
            kept: sum(row.get("second_try") == kept for row in generations) for kept in ("kept", "cut again", "failed")
        },
        "max_new_tokens": args.max_new_tokens,
        "device": device,
        "structured_output": bool(args.engine and args.structured_output),
        "seconds": round(time.perf_counter() - started, 1),
    }
