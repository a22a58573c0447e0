"""mirrorapi.evaluation.fidelity.decisions: the simulator's failure decision as a probability, its ROC AUC and the
failures a threshold on it would answer."""

import pytest
import torch

from mirrorapi.evaluation.fidelity.decisions import decision_table, decision_tokens, failure_probabilities, roc_auc


def test_roc_auc_is_the_share_of_failure_success_pairs_ranked_right():
    # 2 failures (0.9, 0.3) and 2 successes (0.8, 0.2): of the 4 pairs, 0.3 < 0.8 is the one ranked wrong
    assert roc_auc([0.9, 0.8, 0.3, 0.2], [True, False, True, False]) == 0.75
    assert roc_auc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert roc_auc([0.1, 0.9], [True, False]) == 0.0
    assert roc_auc([0.1, 0.2], [False, False]) is None  # no failure to rank


def test_a_threshold_answers_the_calls_above_it():
    table = decision_table([0.95, 0.85, 0.6, 0.4, 0.1], [True, False, True, True, False], thresholds=(0.5, 0.9))
    assert table["calls"] == 5 and table["failures"] == 3
    above_half, above_nine_tenths = table["thresholds"]
    # above 0.5: 0.95, 0.85 and 0.6 answered failures, 2 of them real; 2 of the 3 real ones caught
    assert (above_half["answered"], above_half["right"]) == (3, 2)
    assert above_half["error_precision"] == 66.7 and above_half["error_recall"] == 66.7
    assert (above_nine_tenths["answered"], above_nine_tenths["right"]) == (1, 1)
    assert above_nine_tenths["error_precision"] == 100.0 and above_nine_tenths["error_recall"] == 33.3
    assert decision_table([0.2], [False], thresholds=(0.5,))["thresholds"][0]["error_precision"] is None


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    return AutoTokenizer.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def test_the_probability_of_a_failure_is_how_often_the_model_writes_one(tiny_model):
    # transformers' own sampling after the error string opened: the share of draws that do not close it (a
    # message, a failure) estimates the probability the function reads from the logits
    tokenizer, model = tiny_model
    messages = [{"role": "user", "content": 'GetUserToken {"username": "admin", "password": "secret"}'}]
    (found,) = failure_probabilities(model, tokenizer, [messages])
    assert 0.0 <= found["p_error"] <= 1.0 and 0.0 <= found["p_in_band"] <= 1.0 - found["p_error"]
    assert found["p_failure"] == pytest.approx(found["p_error"] + found["p_in_band"])
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    ids += decision_tokens(tokenizer)["ids"][: decision_tokens(tokenizer)["error_at"] + 1]
    assert tokenizer.decode(ids).endswith('{"error":"')
    draws = 2000
    generated = model.generate(
        torch.tensor([ids]), do_sample=True, max_new_tokens=1, num_return_sequences=draws, top_k=0, top_p=1.0
    )[:, -1]
    written = [tokenizer.decode([token]) for token in generated.tolist()]
    share = sum(not piece.startswith('"') for piece in written) / draws
    assert share == pytest.approx(found["p_error"], abs=0.04)  # ~4 binomial standard deviations at p = 0.5
