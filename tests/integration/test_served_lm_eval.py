"""lm-evaluation-harness against the served default model: its ``local-completions`` model
(``echo`` + ``logprobs``, the server's tokenizer through ``/tokenizer_info`` and
``/tokenize``) scores a local multiple-choice task exactly as its ``hf`` backend does on the
same GGUF file: every item's loglikelihoods within 1e-3 and the same accuracy.

lm-eval lives in its own venv (``make lm-eval``); there is no hub here, so the task is a JSON
dataset and a task YAML written by the test.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from roundgate.actors.model.gguf_file import packaged_path

REPO = Path(__file__).resolve().parents[2]
LM_EVAL = REPO / ".venv-lmeval" / "bin" / "lm_eval"
MODEL = "smollm2-135m-instruct"
TASK = "roundgate_mc"
ATOL = 1e-3
# (question, choices, index of the answer): short, so both backends finish in seconds.
ITEMS = [
    ("What color is the sky on a clear day?", ["blue", "green", "red", "black"], 0),
    ("How many legs does a cat have?", ["two", "four", "six", "eight"], 1),
    ("What is the capital of France?", ["Berlin", "Madrid", "Paris", "Rome"], 2),
    ("Which animal barks?", ["cat", "cow", "fish", "dog"], 3),
    ("What do bees make?", ["honey", "milk", "silk", "wool"], 0),
    ("Which season is the coldest?", ["summer", "winter", "spring", "autumn"], 1),
    ("What is frozen water called?", ["steam", "sand", "ice", "glass"], 2),
    ("Which planet do we live on?", ["Mars", "Venus", "Jupiter", "Earth"], 3),
    ("What do you use to write on paper?", ["pen", "spoon", "shoe", "cup"], 0),
    ("How many days are in a week?", ["five", "seven", "ten", "twelve"], 1),
    ("What gives light during the day?", ["the moon", "a lamp", "the sun", "a star"], 2),
    ("Which fruit is yellow and long?", ["apple", "grape", "cherry", "banana"], 3),
    ("What do fish live in?", ["water", "trees", "sand", "clouds"], 0),
    ("What is two plus two?", ["three", "four", "five", "six"], 1),
    ("Which animal says moo?", ["dog", "cat", "cow", "duck"], 2),
    ("What do plants need to grow?", ["plastic", "metal", "glass", "sunlight"], 3),
    ("Where do birds build nests?", ["trees", "rivers", "cars", "books"], 0),
    ("What is the opposite of hot?", ["warm", "cold", "big", "fast"], 1),
    ("Which shape has three sides?", ["square", "circle", "triangle", "line"], 2),
    ("What do people drink when thirsty?", ["sand", "paper", "oil", "water"], 3),
]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm_eval_task")
    data = root / "items.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in ITEMS)
    )
    (root / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        f"  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n"
    )
    return root


def run_lm_eval(task_dir: Path, out: Path, model: str, model_args: str) -> dict[str, Any]:
    """One lm-eval run: ``{"acc": ..., "lls": {doc_id: [loglikelihood per choice]}}``."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        # Each run its own datasets cache: the two run at once on the same data file.
        "HF_DATASETS_CACHE": str(out / "datasets-cache"),
    }
    cmd = [
        str(LM_EVAL),
        "--model",
        model,
        "--model_args",
        model_args,
        "--tasks",
        TASK,
        "--include_path",
        str(task_dir),
        "--output_path",
        str(out),
        "--log_samples",
        "--batch_size",
        "1",
        "--device",
        "cpu",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    (results,) = out.rglob("results_*.json")
    (samples,) = out.rglob(f"samples_{TASK}_*.jsonl")
    acc = json.loads(results.read_text())["results"][TASK]["acc,none"]
    lls = {}
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        lls[sample["doc_id"]] = [float(r[0][0]) for r in sample["resps"]]
    return {"acc": acc, "lls": lls}


@pytest.mark.skipif(not LM_EVAL.exists(), reason="lm-eval's venv is missing: run `make lm-eval`")
def test_local_completions_scores_as_the_hf_backend(real_model, task_dir, tmp_path) -> None:
    gguf = packaged_path(MODEL)
    # The two runs are independent processes (one scores through the server, the other loads
    # the GGUF itself): run side by side, each one's start-up (imports, the task, the model)
    # overlaps the other's scoring.
    with ThreadPoolExecutor(2) as pool:
        served_run = pool.submit(
            run_lm_eval,
            task_dir,
            tmp_path / "served",
            "local-completions",
            f"model={MODEL},base_url={real_model.url}/v1/completions,tokenizer_backend=remote,"
            "num_concurrent=1,max_retries=1",
        )
        hf_run = pool.submit(
            run_lm_eval,
            task_dir,
            tmp_path / "hf",
            "hf",
            f"pretrained={gguf.parent},gguf_file={gguf.name},dtype=float32",
        )
        served, hf = served_run.result(), hf_run.result()
    assert sorted(served["lls"]) == sorted(hf["lls"]) == list(range(len(ITEMS)))
    diffs = [
        abs(a - b)
        for doc, values in served["lls"].items()
        for a, b in zip(values, hf["lls"][doc], strict=True)
    ]
    print(
        f"lm-eval: {len(diffs)} loglikelihoods, max abs difference {max(diffs):.2e}; "
        f"accuracy served {served['acc']:.3f}, hf {hf['acc']:.3f}"
    )
    assert max(diffs) < ATOL
    assert served["acc"] == hf["acc"]
