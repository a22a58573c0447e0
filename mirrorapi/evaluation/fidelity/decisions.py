"""The simulator's failure decision as a probability: would a threshold on it answer failures better?

A simulator decides early whether a call failed: its answer starts `{"error":"` and the next token either closes
the string (a success, or tau-bench's in-band `"response":"Error: ..."`) or writes a message (a failure). A
greedy answer takes the likelier side, a threshold of 0.5. Teacher-forced on the record's own prompt, the model's
probability of each side says whether another threshold would do better (a higher one answers fewer, surer
failures) and, threshold aside, how well the model ranks the calls that fail above those that do not (the ROC
AUC): a model whose failures rank low cannot be calibrated into answering them.

The probability of a failure is that of a non-empty `error`, plus, for a success, that of a string `response`
starting with an in-band error ("Error..." or "Exception...", what `mirrorapi.transport_failures.in_band_error`
reads as one). In-band failures written as JSON objects (`{"error": ...}` inside the response) are not counted.
"""

from __future__ import annotations

import re
from typing import Any

from mirrorapi.records import observation_json

# The success branch up to its response's first character, as the simulator's target is written
# (`observation_json`): `{"error":"","response":"`. The model decides at ERROR_OPENED (the error string just
# opened: close it or write a message) and at RESPONSE_OPENED (a string response just opened: an in-band error?).
SUCCESS_TEXT = observation_json("", "")[: -len('"}')]
ERROR_OPENED = SUCCESS_TEXT.index('"error":"') + len('"error":"')
RESPONSE_OPENED = len(SUCCESS_TEXT)
IN_BAND_START = re.compile(r"\s*(error|exception)", re.IGNORECASE)
THRESHOLDS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)


class TokenizerSplit(ValueError):
    """The tokenizer writes the success branch with no token boundary at a decision point."""


def decision_tokens(tokenizer: Any) -> dict:
    """The success branch's token ids and, for each decision point, its position in them and the ids of the
    vocabulary's tokens that take each side there."""
    ids = tokenizer(SUCCESS_TEXT, add_special_tokens=False).input_ids
    ends, text = [], ""
    for token_id in ids:
        text += tokenizer.decode([token_id])
        ends.append(len(text))
    if text != SUCCESS_TEXT:
        raise TokenizerSplit(f"the tokenizer does not give back {SUCCESS_TEXT!r} (it decodes to {text!r})")
    for point, name in ((ERROR_OPENED, "the error string's opening"), (RESPONSE_OPENED, "the response's opening")):
        if point not in ends:
            raise TokenizerSplit(f"no token of {SUCCESS_TEXT!r} ends at {name} (token ends: {ends})")
    pieces = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    return {
        "ids": ids,
        # the logits at position p predict token p + 1: the position of the last token before each point
        "error_at": ends.index(ERROR_OPENED),
        "response_at": len(ids) - 1,
        "closes_error": [i for i, piece in enumerate(pieces) if piece.startswith('"')],
        "starts_in_band": [i for i, piece in enumerate(pieces) if IN_BAND_START.match(piece)],
    }


def failure_probabilities(model: Any, tokenizer: Any, prompts: list[list[dict]]) -> list[dict]:
    """For each chat prompt, the model's probabilities at the decision points (teacher-forced on the success
    branch): `p_error` (a non-empty error), `p_in_band` (a success whose response is an in-band error) and
    `p_failure`, their sum. `model` a causal LM on its device, in eval mode."""
    import torch

    tokens = decision_tokens(tokenizer)
    branch = torch.tensor(tokens["ids"])
    out = []
    for messages in prompts:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = torch.tensor(tokenizer(prompt, add_special_tokens=False).input_ids)
        ids = torch.cat([prompt_ids, branch])[None].to(model.device)
        with torch.inference_mode():
            logits = model(ids).logits[0, len(prompt_ids) - 1 :].float()
        probs = torch.softmax(logits, dim=-1)
        # logits[j] predicts the branch's token j, so the token after the branch's token k is at k + 1
        p_error = 1.0 - probs[tokens["error_at"] + 1, tokens["closes_error"]].sum().item()
        # a string response, given a success: the branch's own tokens after the one that closed the error (the
        # tokenizer's way of writing them; another way of writing the same text is left out)
        after = range(tokens["error_at"] + 2, tokens["response_at"] + 1)
        p_string = probs[list(after), branch[list(after)]].prod().item() if after else 1.0
        p_starts = probs[tokens["response_at"] + 1, tokens["starts_in_band"]].sum().item()
        p_in_band = (1.0 - p_error) * p_string * p_starts
        out.append({"p_error": p_error, "p_in_band": p_in_band, "p_failure": p_error + p_in_band})
    return out


def roc_auc(scores: list[float], positive: list[bool]) -> float | None:
    """The probability that a random positive scores above a random negative (ties count half): the
    Mann-Whitney form of the ROC AUC, written here because no kept dependency has it (scikit-learn is not one).
    None without a positive or a negative."""
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def decision_table(p_failure: list[float], failed: list[bool], thresholds: tuple[float, ...] = THRESHOLDS) -> dict:
    """What answering a failure wherever `p_failure` exceeds each threshold would give on calls whose real
    outcome is `failed`: failures answered, right, error precision and recall (%), beside the ROC AUC."""
    real = sum(failed)
    rows = []
    for threshold in thresholds:
        answered = [p > threshold for p in p_failure]
        right = sum(a and f for a, f in zip(answered, failed, strict=True))
        rows.append(
            {
                "threshold": threshold,
                "answered": sum(answered),
                "right": right,
                "error_precision": round(100.0 * right / sum(answered), 1) if any(answered) else None,
                "error_recall": round(100.0 * right / real, 1) if real else None,
            }
        )
    auc = roc_auc(p_failure, failed)
    return {
        "calls": len(failed),
        "failures": real,
        "roc_auc": None if auc is None else round(auc, 3),
        "thresholds": rows,
    }
