"""FAC, judge agreement and the judge's training data show a judge the same text for the same answer:
the inner text of Finish JSON, cut at 8,000 characters and marked with "..."."""

import json

from mirrorapi.data.judge_sft import build_judge_records
from mirrorapi.evaluation.judge.agreement import run_agreement
from mirrorapi.evaluation.judge.scoring import JudgeSettings, run_scoring

QUERY = "Which clubs did Lionel Messi play for? Also give his shirt numbers."
LONG = "Messi played for Barcelona (10, 19, 30), Paris Saint-Germain (30) and Inter Miami (10). " * 100
SHORT = "Barcelona, Paris Saint-Germain and Inter Miami."
FINAL_ANSWERS = {  # query id -> the Finish arguments the agent wrote (StableToolBench's converted answers)
    "1": json.dumps({"return_type": "give_answer", "final_answer": LONG}, indent=2),
    "2": json.dumps({"return_type": "give_answer", "final_answer": SHORT}, indent=2),
}


def test_fac_agreement_and_training_show_the_same_prompt(faulty_judge, tmp_path):
    assert len(LONG.strip()) > 8000
    answers = tmp_path / "answers" / "agent"
    answers.mkdir(parents=True)
    (answers / "G1_instruction.json").write_text(
        json.dumps(
            {
                qid: {
                    "query": QUERY,
                    "available_tools": [],
                    "answer": {"method": "CoT@1", "total_steps": 3, "final_answer": final, "answer_details": []},
                }
                for qid, final in FINAL_ANSWERS.items()
            }
        )
    )
    ids = tmp_path / "ids"
    ids.mkdir()
    (ids / "G1_instruction.json").write_text(json.dumps({qid: 0 for qid in FINAL_ANSWERS}))
    labelled = [
        {
            "source": "parity",
            "id": qid,
            "query": QUERY,
            "final_answer": final,
            "label": "Solved" if qid == "1" else "Unsolved",
            "label_kind": "test",
        }
        for qid, final in FINAL_ANSWERS.items()
    ]
    (tmp_path / "labelled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled))
    settings = JudgeSettings([faulty_judge.base_url], faulty_judge.model)

    run_scoring(answers.parent, ids, settings, tmp_path / "fac", progress=False)
    fac = sorted(messages[1]["content"] for messages in faulty_judge.received)
    faulty_judge.received.clear()
    run_agreement([tmp_path / "labelled.jsonl"], settings, tmp_path / "agreement", progress=False)
    agreement = sorted(messages[1]["content"] for messages in faulty_judge.received)
    splits, _ = build_judge_records(labelled, test_fraction=0.0, balance="none")
    training = sorted(record["prompt"][1]["content"] for record in splits["train"])

    expected = sorted(
        [f"Query:\n{QUERY}\n\nFinal answer:\n{LONG.strip()[:8000]}...", f"Query:\n{QUERY}\n\nFinal answer:\n{SHORT}"]
    )
    assert fac == expected
    assert agreement == expected
    assert training == expected
