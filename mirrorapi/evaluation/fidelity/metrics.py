"""Fidelity metrics: how close simulated (and baseline) observations are to the real ones.

Used by `mirrorapi.evaluation.fidelity.replay` after a replay; every function here works on plain observations
(`{"error": str, "response": ...}`) and pair dicts, so it can score any two sets of answers.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import jsonschema

from mirrorapi.evaluation.bootstrap import BOOTSTRAP_RESAMPLES, percentile_interval, resample_weights
from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.prompts.simulator_formats import response_schema
from mirrorapi.records import parse_repr_key
from mirrorapi.tools import ApiDoc, ToolRegistry, UnknownName
from mirrorapi.transport_failures import api_failed, transport_failure

logger = logging.getLogger(__name__)


class FidelityError(Exception):
    """A run that cannot start: no usable pairs, a server that does not answer, an unloadable model."""


def api_id(pair: dict) -> tuple[str, str, str]:
    """The normalised (category, tool, api) of a pair: the same API whatever spelling a source uses."""
    return standardize_category(pair["category"]), standardize(pair["tool_name"]), api_key_name(pair["api_name"])


# ------------------------------------------------------------------------------------ metrics
def payload_text(observation: dict | None) -> str:
    """What is compared as text: the error and the response (structured responses as compact JSON)."""
    if not observation:
        return ""
    response = observation.get("response", "")
    response = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
    return " ".join(part for part in (observation.get("error", ""), response) if part)


def is_error(observation: dict | None) -> bool:
    """An error observation: the API's failure (`transport_failures.api_failed`: `error` set, or an in-band error
    reply such as tau-bench's "Error: ...")."""
    return (
        observation is not None
        and bool(observation)
        and api_failed(observation.get("error", ""), observation.get("response", ""))
    )


def json_structure(response: Any) -> Any:
    """The response as a JSON object/array (parsing a JSON string), or None when it is not one."""
    if isinstance(response, (dict, list)):
        return response
    if isinstance(response, str):
        try:
            value = json.loads(response)
        except ValueError:
            return None
        return value if isinstance(value, (dict, list)) else None
    return None


def conforms(schema: dict, response: Any) -> bool:
    """The response, or the JSON / Python literal it holds as text, is valid under `schema`."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    if validator.is_valid(response):
        return True
    if isinstance(response, str):
        try:
            return validator.is_valid(parse_repr_key(response))
        except ValueError:
            return False
    return False


def find_doc(registry: ToolRegistry | None, pair: dict) -> ApiDoc | None:
    if registry is None:
        return None
    try:
        return registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
    except UnknownName:
        return None


def slice_metrics(rows: list[dict], side: str) -> dict:
    """Metrics of one side ("simulated" or "baseline") over compared call rows, all in %.

    bleu4: corpus BLEU-4 (sacrebleu) of the payload texts, with its two parts apart: bleu4_length (this side's
    tokens over the real answers', sacrebleu's ratio) and bleu4_brevity_penalty (the factor a length under 100%
    costs: a side whose n-gram precisions match another's scores lower when it writes less); rouge_l: mean
    ROUGE-L F1 (rouge-score);
    valid_json: share of calls whose real response is a JSON object/array where this side's is one
    too; error_agreement: share of calls where this side is an error exactly when the real call is (a call it
    gave no answer to, `{side}_error` None, is wrong either way: `errors["no_answer"]` or a `real_only` miss);
    error_precision: of the calls this side answered with an error, the share whose real call erred
    (`error_precision_n` such calls); error_recall: of the calls whose real call erred, the share this
    side answered with an error (`error_recall_n` such calls); both None without such calls, and each with its
    95% bootstrap interval (`error_precision_ci95`, `error_recall_ci95`; resamples without such calls left out);
    schema_conformance: share of successful real calls with a documented response schema whose
    response this side fills conformingly (`schema_conformance_real` is the real responses' own
    share, the ceiling); embedding_cosine: mean cosine x 100 when an embedding model was given.
    """
    import sacrebleu

    n = len(rows)
    if not n:
        return {"n": 0}
    hyps = [r[f"{side}_text"] for r in rows]
    refs = [r["real_text"] for r in rows]
    json_rows = [r for r in rows if r["real_json"]]
    schema_rows = [r for r in rows if r["schema_real"] is not None]
    cosines = [r[f"{side}_cosine"] for r in rows if r.get(f"{side}_cosine") is not None]
    # `{side}_error` None: no answer at all (a missing example, a failed request): a miss of a real failure, a
    # wrong call of a success (`no_answer`), and no error answer for precision to count.
    errors = {"both": 0, "real_only": 0, f"{side}_only": 0, "neither": 0, "no_answer": 0}
    for r in rows:
        real, other = r["real_error"], r[f"{side}_error"]
        if other is None and not real:
            errors["no_answer"] += 1
        else:
            errors["both" if real and other else "real_only" if real else f"{side}_only" if other else "neither"] += 1

    def pct(count: int, total: int) -> float | None:
        return 100.0 * count / total if total else None

    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    return {
        "n": n,
        "bleu4": bleu.score,
        "bleu4_length": pct(bleu.sys_len, bleu.ref_len),
        "bleu4_brevity_penalty": 100.0 * bleu.bp,
        "rouge_l": 100.0 * statistics.fmean(r[f"{side}_rouge_l"] for r in rows),
        "valid_json": pct(sum(r[f"{side}_json"] for r in json_rows), len(json_rows)),
        "valid_json_n": len(json_rows),
        "error_agreement": pct(errors["both"] + errors["neither"], n),
        "errors": errors,
        "error_precision": pct(errors["both"], errors["both"] + errors[f"{side}_only"]),
        "error_precision_n": errors["both"] + errors[f"{side}_only"],
        "error_recall": pct(errors["both"], errors["both"] + errors["real_only"]),
        "error_recall_n": errors["both"] + errors["real_only"],
        **_error_intervals([r["real_error"] for r in rows], [bool(r[f"{side}_error"]) for r in rows], episodes(rows)),
        "schema_conformance": pct(sum(r[f"schema_{side}"] for r in schema_rows), len(schema_rows)),
        "schema_conformance_real": pct(sum(r["schema_real"] for r in schema_rows), len(schema_rows)),
        "schema_n": len(schema_rows),
        "embedding_cosine": 100.0 * statistics.fmean(cosines) if cosines else None,
    }


def episodes(rows: list[dict]) -> list[tuple] | None:
    """Each row's episode, (source, episode): what the intervals resample (`bootstrap.resample_weights`); None
    (the calls resampled one by one) for rows that do not say."""
    if not all("episode" in r for r in rows):
        return None
    return [(r.get("source"), r["episode"]) for r in rows]


def _one_episode(groups: list[tuple] | None) -> bool:
    """Calls of a single episode: every resample of its episodes is the episode itself, so there is no interval."""
    return groups is not None and len(set(groups)) < 2


def _error_intervals(real: list[bool], answered: list[bool], groups: list[tuple] | None) -> dict:
    """Error precision's and recall's 95% bootstrap intervals over resamples of the calls' episodes (vectorised: a
    slice may hold thousands of calls); None where no resample has a call to count."""
    import numpy as np

    if _one_episode(groups):
        return {"error_precision_ci95": None, "error_recall_ci95": None}
    weights = resample_weights(len(real), groups)
    real_errors, answered_errors = np.array(real, dtype=float), np.array(answered, dtype=float)
    both = weights @ (real_errors * answered_errors)
    answered_n, real_n = weights @ answered_errors, weights @ real_errors
    return {
        "error_precision_ci95": percentile_interval(100.0 * both[answered_n > 0] / answered_n[answered_n > 0], None),
        "error_recall_ci95": percentile_interval(100.0 * both[real_n > 0] / real_n[real_n > 0], None),
    }


class Embedder:
    """Sentence embeddings from a local transformers model: mean of the last hidden states over tokens.

    Mean pooling is what sentence-transformers does for most models; it is written out here (a few
    lines) instead of adding that package and its scikit-learn/scipy dependencies.
    """

    def __init__(self, path: str, batch_size: int = 16, max_length: int = 512):
        from transformers import AutoModel, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModel.from_pretrained(path).eval()
        except (OSError, ValueError) as exc:
            raise FidelityError(f"cannot load the embedding model at {path}: {exc}") from exc
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.batch_size, self.max_length = batch_size, max_length

    def encode(self, texts: list[str]):
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths batch with little padding
        vectors: list = [None] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                indices = order[start : start + self.batch_size]
                batch = self.tokenizer(
                    [texts[i] or " " for i in indices],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0), dim=-1)
                for i, vector in zip(indices, pooled, strict=True):
                    vectors[i] = vector
        return torch.stack(vectors)

    def cosines(self, first: list[str], second: list[str]) -> list[float]:
        return (self.encode(first) * self.encode(second)).sum(-1).tolist()


# ---------------------------------------------------------------------------------- comparing
def paired_difference(
    first: list[dict], second: list[dict], first_side: str = "simulated", second_side: str = "baseline"
) -> dict:
    """One side of compared rows against another, `first` and `second` holding the same calls in the same order:
    the simulator against the nearest example is `paired_difference(rows, rows)`, a session pass against the
    call-by-call one `paired_difference(with_rows, without_rows, "simulated", "simulated")`. Each metric's
    difference (first minus second, in points) and its 95% percentile bootstrap interval over resamples of the
    calls' episodes (`mirrorapi.evaluation.bootstrap`, `episodes`). An interval that holds 0 is no evidence either
    way. A call without an example counts as the example's miss, as in `slice_metrics`.

    Written here, not taken from sacrebleu's paired tests: those give a p-value of 1/(resamples + 1) to two equal
    systems, and no interval of the difference. BLEU-4 is recomputed per resample from the calls' n-gram counts
    (sacrebleu's own `compute_bleu`, smoothed as `corpus_bleu` is), ROUGE-L as the mean of the calls' F1."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    counter = BLEU(effective_order=True)  # its per-call counts only; effective_order silences the sentence warning

    def counts(rows: list[dict], side: str) -> np.ndarray:
        scores = (counter.sentence_score(r[f"{side}_text"], [r["real_text"]]) for r in rows)
        return np.array([[*s.counts, *s.totals, s.sys_len, s.ref_len] for s in scores], dtype=np.int64)

    def corpus_bleu(total: np.ndarray) -> float:
        total = np.rint(total).astype(np.int64)  # a resample's summed counts, whole numbers in floats
        correct, possible = total[0:4].tolist(), total[4:8].tolist()
        return BLEU.compute_bleu(correct, possible, int(total[8]), int(total[9]), smooth_method="exp").score

    if [r["real_text"] for r in first] != [r["real_text"] for r in second]:
        raise ValueError("paired_difference: the two lists of rows are not the same calls in the same order")
    groups = episodes(first)
    weights = resample_weights(len(first), groups)
    first_counts, second_counts = counts(first, first_side), counts(second, second_side)
    bleu_gaps = [
        corpus_bleu(a) - corpus_bleu(b) for a, b in zip(weights @ first_counts, weights @ second_counts, strict=True)
    ]
    first_f1 = np.array([r[f"{first_side}_rouge_l"] for r in first])
    second_f1 = np.array([r[f"{second_side}_rouge_l"] for r in second])
    rouge_gaps = 100.0 * (weights @ (first_f1 - second_f1)) / weights.sum(axis=1)  # a resample's calls vary in number
    no_interval = _one_episode(groups)
    return {
        "resamples": BOOTSTRAP_RESAMPLES,
        # what was resampled: "calls", or "N episodes" (with few, an interval is rough however it is drawn)
        "resampled": "calls" if groups is None else f"{len(set(groups))} episodes",
        "bleu4": {
            "difference": corpus_bleu(first_counts.sum(axis=0)) - corpus_bleu(second_counts.sum(axis=0)),
            "ci95": None if no_interval else percentile_interval(bleu_gaps, None),
        },
        "rouge_l": {
            "difference": float(100.0 * (first_f1.mean() - second_f1.mean())),
            "ci95": None if no_interval else percentile_interval(rouge_gaps, None),
        },
    }


def resampled_text(found: dict) -> str:
    """How a `paired_difference` drew its interval, as the reports say it: `1,000 resamples of the 5 episodes`."""
    return f"{found['resamples']:,} resamples of the {found.get('resampled', 'calls')}"


def difference_text(found: dict) -> str:
    """A `paired_difference` as the reports write it: `ROUGE-L +1.8 [-0.8, +4.8], BLEU-4 -2.5 [-7.2, +1.2]`
    (`[no interval: one episode]` where the calls are one episode's)."""

    def interval(bounds: list[float] | None) -> str:
        return "[no interval: one episode]" if bounds is None else f"[{bounds[0]:+.1f}, {bounds[1]:+.1f}]"

    return ", ".join(
        f"{title} {found[key]['difference']:+.1f} {interval(found[key]['ci95'])}"
        for key, title in (("rouge_l", "ROUGE-L"), ("bleu4", "BLEU-4"))
    )


SIDES = ("simulated", "baseline")
# What the replay keeps of the server's answer besides the observation (`replay._post`): not part of `simulated_extra`.
ANSWER_FACTS = ("failed", "outcome", "provenance")


def answered_from_cache(answer: dict) -> bool:
    """Whether the server answered from what its cache held before any simulation: a hit whose provenance is
    not the simulator's (a recorded or imported real answer: the calls of its training pool). Those calls say
    nothing about the simulator and are reported apart. A hit on the simulator's own earlier answer to the same
    call counts as simulated. A server that does not say how it answered (no `x-mirrorapi-outcome` header:
    StableToolBench's own) has every call counted as simulated."""
    return answer.get("outcome") == "hit" and not str(answer.get("provenance") or "").startswith("simulated:")


def compare(
    pairs: list[dict],
    simulated: list[dict],
    baseline: Callable[[dict], dict | None] | None = None,
    registry: ToolRegistry | None = None,
    embedder: Embedder | None = None,
) -> list[dict]:
    """One row per call: the three observations and what each side scores on it."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rows, schemas = [], {}
    for pair, sim in zip(pairs, simulated, strict=True):
        real = pair["response"]
        real_error = is_error(real)
        if api_id(pair) not in schemas:  # checking a schema is costly: once per API
            schemas[api_id(pair)] = response_schema(find_doc(registry, pair))
        schema = schemas[api_id(pair)] if not real_error else None
        row = {
            key: pair[key] for key in ("source", "episode", "step", "category", "tool_name", "api_name", "tool_input")
        }
        row.update(
            api="/".join(api_id(pair)),
            real=real,
            real_text=payload_text(real),
            real_error=real_error,
            real_json=not real_error and json_structure(real["response"]) is not None,
            schema_real=conforms(schema, real["response"]) if schema else None,
            request_failed=bool(sim.get("failed")),
            outcome=sim.get("outcome"),
            provenance=sim.get("provenance"),
            from_cache=answered_from_cache(sim),
            simulated_extra={k: v for k, v in sim.items() if k not in ("error", "response", *ANSWER_FACTS)},
        )
        observations = {
            "simulated": {"error": sim["error"], "response": sim["response"]},
            "baseline": baseline(pair) if baseline else None,
        }
        # No answer (the request failed, or the server's simulator failed to write one) is no failure of the API:
        # on the error measures it is no answer, as a missing baseline is (`slice_metrics`).
        unanswered = {"simulated": row["request_failed"] or transport_failure(sim["error"], "") == "simulator_failure"}
        for side, obs in observations.items():
            if side == "baseline" and baseline is None:
                continue
            row[side] = obs
            row[f"{side}_text"] = payload_text(obs)
            # rouge-score gives 0 to two texts without a word (`""`, `[]`); the same text is a full match. A missing
            # baseline (no training call of this API) is wrong on every check: its "" is no match for an empty answer.
            row[f"{side}_rouge_l"] = (
                0.0
                if obs is None
                else 1.0
                if row[f"{side}_text"] == row["real_text"]
                else scorer.score(row["real_text"], row[f"{side}_text"])["rougeL"].fmeasure
            )
            row[f"{side}_error"] = is_error(obs) if obs is not None and not unanswered.get(side) else None
            row[f"{side}_json"] = obs is not None and json_structure(obs["response"]) is not None
            row[f"schema_{side}"] = (
                None if not schema else obs is not None and not is_error(obs) and conforms(schema, obs["response"])
            )
        rows.append(row)
    if embedder is not None and rows:
        for side in SIDES:
            if side in rows[0]:
                cosines = embedder.cosines([r["real_text"] for r in rows], [r[f"{side}_text"] for r in rows])
                for row, cosine in zip(rows, cosines, strict=True):
                    row[f"{side}_cosine"] = cosine
    return rows


def build_report(rows: list[dict], server: str, baseline: bool, include_cache_hits: bool = False) -> dict:
    """Metrics overall, per source and per API, for the simulator and (when given) the baseline, over the calls the
    server did not answer from what its cache held (`from_cache`; all of them with `include_cache_hits`); those
    are counted apart (`cache_hits`), with how the server answered every call (`outcomes`)."""
    hits = [r for r in rows if r["from_cache"]]
    scored = rows if include_cache_hits else [r for r in rows if not r["from_cache"]]

    def block(subset: list[dict]) -> dict:
        return {
            "n": len(subset),
            "request_failures": sum(r["request_failed"] for r in subset),
            "simulator_failures": sum(
                transport_failure(r["simulated"]["error"], "") == "simulator_failure" for r in subset
            ),
            "baseline_coverage": (
                round(100.0 * sum(r["baseline"] is not None for r in subset) / len(subset), 2)
                if baseline and subset
                else None
            ),
            **{side: slice_metrics(subset, side) for side in SIDES if side == "simulated" or baseline},
        }

    def compared(subset: list[dict]) -> dict:  # overall and per source: an API's few calls tell a test nothing
        found = block(subset)
        if baseline and subset:
            found["simulator_against_example"] = paired_difference(subset, subset)
        return found

    by_source, by_api = defaultdict(list), defaultdict(list)
    for row in scored:
        by_source[row["source"]].append(row)
        by_api[row["api"]].append(row)
    hits_by_source: dict[str, int] = defaultdict(int)
    for row in hits:
        hits_by_source[row["source"]] += 1
    outcomes: dict[str, int] = defaultdict(int)
    for row in rows:
        outcomes[row["outcome"] or "not said"] += 1
    return {
        "server": server,
        "calls": len(rows),
        "scored": len(scored),
        "baseline": baseline,
        "cache_hits": {
            "n": len(hits),
            "scored": include_cache_hits,
            "per_source": dict(sorted(hits_by_source.items())),
        },
        "outcomes": dict(sorted(outcomes.items())),
        "embedding": any("simulated_cosine" in r for r in rows[:1]),
        "overall": compared(scored),
        "per_source": {s: compared(r) for s, r in sorted(by_source.items())},
        "per_api": {a: block(r) for a, r in sorted(by_api.items())},
    }
