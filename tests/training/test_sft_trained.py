"""What the shared fixtures promise: the tiny simulator trained by the real recipe answers its training
prompts with `{"error", "response"}` JSON, is served by `transformers serve`, carries a model card;
the tiny judge answers with one of the two verdicts."""

import json

import openai
import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer

from mirrorapi.prompts.judge_formats import parse_verdict
from mirrorapi.prompts.simulator_output import is_strict_observation
from mirrorapi.training.recipe import RecipeArguments, training_splits


def greedy(model_dir, prompts, max_new_tokens):
    """Greedy answers of a model folder to chat prompts (batched, left-padded)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    answers = []
    for start in range(0, len(prompts), 8):
        batch = tokenizer.apply_chat_template(
            prompts[start : start + 8], add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
        answers += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return answers


@pytest.fixture(scope="module")
def simulator_training_prompts(trained_simulator_dir, simulator_sft_dir):
    """The exact records the fixture trained on (the recipe's own selection, read from the model card)."""
    resolved = json.loads((trained_simulator_dir / "mirrorapi_training.json").read_text())["recipe"]["resolved"]
    recipe = RecipeArguments(dataset_path=str(simulator_sft_dir), max_train_samples=resolved["max_train_samples"])
    tokenizer = AutoTokenizer.from_pretrained(trained_simulator_dir)
    train, _ = training_splits(load_from_disk(str(simulator_sft_dir)), recipe, tokenizer, resolved["max_length"], None)
    assert len(train) == 48
    return [r["prompt"] for r in train]


@pytest.fixture(scope="module")
def simulator_answers(trained_simulator_dir, simulator_training_prompts):
    return greedy(trained_simulator_dir, simulator_training_prompts, max_new_tokens=160)


@pytest.mark.slow
def test_trained_simulator_answers_json_observations(simulator_answers):
    valid = [is_strict_observation(a) for a in simulator_answers]
    assert sum(valid) / len(valid) >= 0.95, [a for a, ok in zip(simulator_answers, valid, strict=True) if not ok]


@pytest.mark.slow
def test_model_card_beside_the_weights(trained_simulator_dir, simulator_sft_dir, tiny_model_dir):
    info = json.loads((trained_simulator_dir / "mirrorapi_training.json").read_text())
    stats = json.loads((simulator_sft_dir / "stats.json").read_text())
    assert (info["kind"], info["prompt_format"], info["base_model"]) == (
        "simulator",
        "mirrorapi-v1",
        str(tiny_model_dir),
    )
    assert info["dataset_stats"] == stats and info["recipe"]["resolved"]["max_train_samples"] == 48
    assert info["metrics"]["steps"] == 120
    readme = (trained_simulator_dir / "README.md").read_text()
    for fact in (str(tiny_model_dir), "`mirrorapi-v1`", str(simulator_sft_dir), "| test_ood |", "max_steps: 120"):
        assert fact in readme


@pytest.mark.slow
def test_simulator_engine_serves_the_checkpoint(simulator_engine, simulator_training_prompts, simulator_answers):
    index = next(i for i, a in enumerate(simulator_answers) if is_strict_observation(a))
    client = openai.OpenAI(base_url=simulator_engine.base_url, api_key="EMPTY")
    completion = client.chat.completions.create(
        model=simulator_engine.model, temperature=0, max_tokens=160, messages=simulator_training_prompts[index]
    )
    assert is_strict_observation(completion.choices[0].message.content)


@pytest.mark.slow
def test_trained_judge_gives_one_of_two_verdicts(trained_judge_dir, judge_sft_dir):
    dataset = load_from_disk(str(judge_sft_dir))
    prompts = [r["prompt"] for r in dataset["test"]] + [r["prompt"] for r in dataset["train"].select(range(9))]
    answers = greedy(trained_judge_dir, prompts, max_new_tokens=24)
    verdicts = [parse_verdict(a)[0] for a in answers]
    assert all(v in ("Solved", "Unsolved") for v in verdicts), answers
    info = json.loads((trained_judge_dir / "mirrorapi_training.json").read_text())
    assert (info["kind"], info["prompt_format"]) == ("judge", "fac-v1")


def test_a_token_on_the_command_line_is_hidden_in_the_model_card(trained_judge_dir, fake_hub_token):
    """`--hub_token hf_...`, which TRL's parser takes, was written into the model card's command line and the record
    (audit of 2026-12-01); both show `<hidden>` for it, as transformers' own records do."""
    for name in ("README.md", "mirrorapi_training.json"):
        text = (trained_judge_dir / name).read_text()
        assert fake_hub_token not in text and "<hidden>" in text, name
