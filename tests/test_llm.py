"""Decoder LLMs and LoRA (--task text): tiny Qwen2 and Llama models made here (llmdata.py: real
architectures and tokenizers, random weights), so transformers' and peft's own code runs on CPU,
offline. Fast: the size and memory rules against transformers' own parameter counts, and
recommend. Slow: render, train, predict."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import llmdata
import pandas as pd
import pytest
import textdata
import torch
from textdata import minilm_dir
from typer.testing import CliRunner

from conftest import RUN_ENV, dry_run_into_output, import_project, needs_text, render, run_script
from kagtpl.cli import app
from kagtpl.template import adapters

pytestmark = needs_text  # README command 1 has no text libraries: skipped there, with the way to install them

MISTRAL_7B = {  # mistralai/Mistral-7B-v0.3's config.json (the sizes)
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32768,
    "max_position_embeddings": 32768,
}


@pytest.fixture(scope="module")
def llms(tmp_path_factory) -> dict[str, Path]:
    """Three competitions (authors: multiclass, reviews: binary, essays: regression) and the two
    tiny models, tokenizers trained on the authors' texts."""
    root = tmp_path_factory.mktemp("llm")
    found = {name: write(root / name) for name, write in textdata.LAYOUTS.items()}
    texts = pd.read_csv(found["authors"] / "train.csv")["text"].tolist()
    found["qwen"] = llmdata.write_tiny_llm(root / "qwen2-tiny", texts, "qwen2")
    found["llama"] = llmdata.write_tiny_llm(root / "llama-tiny", texts, "llama")
    return found


def llm_project(dest: Path, llms: dict, layout: str, model: str, **extra) -> Path:
    from test_text import ANSWERS, METRICS

    answers = {
        "task": "text",
        "gpu": "cpu",
        "data_dir": str(llms[layout]),
        "model": f"tiny/{model}",
        "model_dir": str(llms[model]) if model in llms else str(minilm_dir()),
        "folds": 2,
        "epochs": 1,
        **ANSWERS[layout],
        "metric": METRICS[layout],
        "id_col": "text_id" if layout == "essays" else "id",
        **extra,
    }
    return render(dest, **answers)


# ----------------------------------------------------------------------------- fast: size and memory rules


# peft asks transformers a deprecated question, as in adapters.py
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_the_size_rule_counts_a_7b_model_as_transformers_builds_it():
    """params_m (recommend's and the batch rule's figure) against the parameters transformers
    itself creates for Mistral-7B (on the meta device: no memory), and LoRA's count against peft's."""
    import peft
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = dict(MISTRAL_7B)
    hf = AutoConfig.for_model(config.pop("model_type"), **config, num_labels=2)
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(hf)
    real = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(adapters().params_m(MISTRAL_7B) - real) / real < 0.001, (adapters().params_m(MISTRAL_7B), real)
    lora = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=16, target_modules="all-linear"))
    trained = sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n) / 1e6
    assert abs(adapters().lora_params_m(MISTRAL_7B, 16) - trained) < 0.01, trained  # 41.9M, 0.59%


def test_recommend_a_7b_llm_on_a_t4_takes_4bit_and_shows_the_memory(tmp_path):
    folder = tmp_path / "mistral-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MISTRAL_7B))
    runner = CliRunner()
    args = ["recommend", "--task", "text", "--model-dir", str(folder)]
    t4 = runner.invoke(app, [*args, "--gpu", "t4"], env={"COLUMNS": "300"})
    assert t4.exit_code == 0, t4.output
    rows = {line.split("│")[1].strip(): line for line in t4.output.splitlines() if line.count("│") >= 3}
    assert "4bit" in rows["quant"] and "16-bit weights take 13.2 GB of 16" in rows["quant"], t4.output
    assert re.search(
        r"weights 3\.\d \+ trained 0\.6\d \+ activations [\d.]+ \+ CUDA 0\.5 = [\d.]+ GB of 16 GB", t4.output
    )
    assert "r 16, alpha 32, all-linear" in rows["LoRA"] and "41.9M (0.59%)" in rows["LoRA"], t4.output
    assert "7.1B params: read from" in t4.output
    a100 = runner.invoke(app, [*args, "--gpu", "a100-80"], env={"COLUMNS": "300"})
    assert a100.exit_code == 0 and re.search(r"│ quant\s+│ none", a100.output), a100.output
    missing = runner.invoke(app, ["recommend", "--task", "text", "--model-dir", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no readable config.json" in missing.output


# ----------------------------------------------------------------------------- slow: render and run


def adapter_keys_only(state: dict) -> bool:
    return all("lora_" in k or "modules_to_save" in k or k in ("y_mean", "y_std") for k in state)


def notebook_setup_on_kaggle(project: Path, root: Path) -> Path:
    """The notebook's cells before run.py, run in a Kaggle tree simulated under `root` with the
    code and weights datasets attached; returns /kaggle/working."""
    import nbformat

    for dataset in ("code", "weights"):
        shutil.copytree(project / "kaggle" / dataset, root / "input" / f"{project.name}-{dataset}")
    nb = nbformat.read(project / "kaggle" / "notebook.ipynb", as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    setup = "\n".join(cells[: next(i for i, c in enumerate(cells) if '"run.py"' in c)])
    env = {**RUN_ENV, "KAGGLE_ROOT": str(root)}
    r = subprocess.run([sys.executable, "-c", setup], cwd=root.parent, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return root / "working"


@pytest.mark.slow
def test_an_llm_trains_adapters_and_predict_swaps_them_on_one_base(llms, tmp_path):
    """Qwen2 (a chat template, a pad token of its own), 3 authors: the prompt function is the
    user's, checkpoints hold adapters and head only, a rerun resumes, predict loads the base
    once and swaps each fold's adapters in, a fold missing is fine, another base is refused."""
    project = llm_project(tmp_path / "p", llms, "authors", "qwen", epochs=2)
    train_py = project / "train.py"
    source = train_py.read_text()
    assert source.count("return sep.join(row.tolist())") == 1
    train_py.write_text(
        source.replace("return sep.join(row.tolist())", 'return "Who wrote this? " + sep.join(row.tolist())')
    )
    log = run_script(project, "train.py", "--device", "cpu").stdout
    assert "TEXT MODEL: a decoder LLM (qwen2)" in log and "chat template on; LoRA on; quant none; lr 0.0002" in log
    assert re.search(
        r"^LORA: r 16, alpha 32, dropout 0.05, targets all-linear; [\d.]+M of [\d.]+M parameters", log, re.M
    )
    assert "OOF: logloss=" in log, log[-2000:]
    base_bytes = (llms["qwen"] / "model.safetensors").stat().st_size
    for k in (0, 1):
        path = project / "output" / f"model_fold{k}.pth"
        ckpt = torch.load(path, weights_only=True)
        assert adapter_keys_only(ckpt["model"]) and any("score" in key for key in ckpt["model"]), list(ckpt["model"])
        assert path.stat().st_size < base_bytes / 2, (path.stat().st_size, base_bytes)
        config = ckpt["config"]
        assert config["lora"] == "on" and config["lora_r"] == 16 and len(config["base_signature"]) == 16
        assert config["model_dir"] == str(llms["qwen"]) and config["chat_template"] == "on"
    m = import_project(project, ("train", "texts"))
    tokenizer = m.texts.load_tokenizer(project / "output" / "tokenizer")
    df = pd.DataFrame({"text": ["By the lake."]})
    assert m.train.join_texts(df, ["text"], "\n", Path("t.csv")) == ["Who wrote this? By the lake."]
    prefix, suffix = m.texts.input_specials(tokenizer, chat=True)
    assert tokenizer.decode(prefix) == "<|im_start|>user\n" and tokenizer.decode(suffix).endswith("assistant\n")
    long = m.texts.encode([pd.Series(range(100)).to_numpy()], 24, "head", (prefix, suffix))[0]
    assert len(long) == 24 and long[-len(suffix) :].tolist() == suffix  # the prompt is cut, never the template
    again = run_script(project, "train.py", "--device", "cpu").stdout
    assert again.count("is complete, skipping (resume)") == 2, again[-2000:]
    handle = "qwen-lm/qwen2.5/transformers/7b-instruct/1"
    pkg = CliRunner().invoke(
        app,
        ["kaggle", str(project), "--user", "alice", "--no-wheels", "--competition", "llm-comp", "--base-model", handle],
    )
    assert pkg.exit_code == 0, pkg.output
    meta = json.loads((project / "kaggle" / "kernel-metadata.json").read_text())
    assert meta["model_sources"] == [handle] and meta["dataset_sources"] == ["alice/p-code", "alice/p-weights"]
    shipped = sorted(p.name for p in (project / "kaggle" / "weights").iterdir())
    assert shipped == ["dataset-metadata.json", "model_fold0.pth", "model_fold1.pth", "tokenizer"], shipped
    notebook = (project / "kaggle" / "notebook.ipynb").read_text()
    assert "--model-dir={INPUT / 'qwen2.5/transformers/7b-instruct/1'}" in notebook
    working = notebook_setup_on_kaggle(project, tmp_path / "kaggle-root")
    assert {"model_fold0.pth", "model_fold1.pth", "tokenizer"} <= {p.name for p in working.iterdir()}
    saved = sorted(p.name for p in (project / "output" / "tokenizer").iterdir())
    assert sorted(p.name for p in (working / "tokenizer").iterdir()) == saved  # tokenizer.json and its config too
    assert not (working / "dataset-metadata.json").exists()
    log = run_script(project, "predict.py").stdout
    assert log.count("BASE MODEL: ") == 1 and log.count("PREDICT: model_fold") == 2, log
    sub = pd.read_csv(project / "output" / "submission.csv")
    assert len(sub) == 48 and (sub[["EAP", "HPL", "MWS"]].sum(axis=1) - 1).abs().max() < 1e-4
    served_from_a_moved_base(project, llms, tmp_path, sub)
    (project / "output" / "model_fold1.pth").unlink()  # a partial run: the folds there are
    assert "ENSEMBLE: 1 checkpoint(s), folds [0]" in run_script(project, "predict.py").stdout
    before = (project / "output" / "submission.csv").read_bytes()
    other = run_script(project, "predict.py", "--model-dir", str(llms["llama"]), check=False)
    lines = [line for line in (other.stdout + other.stderr).splitlines() if line.startswith("ERROR")]
    assert other.returncode == 1 and len(lines) == 1, other.stdout + other.stderr
    assert "holds LoRA adapters for a base model with config signature" in lines[0] and "llama-tiny" in lines[0]
    assert (project / "output" / "submission.csv").read_bytes() == before


def served_from_a_moved_base(project: Path, llms: dict, tmp_path: Path, sub: pd.DataFrame) -> None:
    """serve.py --model-dir: the base model where it is now (a copy elsewhere), loaded once; each
    LoRA fold swaps in per call and the answers are predict.py's. kagtpl kaggle --serve ships the
    base named by --model-dir in the weights dataset, and without one is one red line."""
    from test_serve import STANDIN, serve_env

    moved = Path(shutil.copytree(llms["qwen"], tmp_path / "moved-qwen"))
    comp = tmp_path / "llm-comp"
    shutil.copytree(STANDIN, comp / "kaggle_evaluation")
    flags = ["--data-dir", str(comp), "--data-paths", str(llms["authors"] / "test.csv"), "--model-dir", str(moved)]
    log = run_script(project, "serve.py", "--device", "cpu", *flags, env=serve_env(STANDIN_BATCH_ROWS=16)).stdout
    assert log.count(f"BASE MODEL: {moved} ") == 1 and "SERVE: ensemble: 2 fold(s)" in log, log
    assert re.search(r"^SERVE: dry run done in [\d.]+s: 3 call\(s\), 48 rows, 0 fallback", log, re.M), log
    served = pd.read_parquet(project / "submission.parquet").set_index("id").loc[sub["id"].astype(str)]
    assert abs(served.to_numpy() - sub.set_index("id").to_numpy()).max() < 1e-5
    kaggle = ["kaggle", str(project), "--user", "alice", "--no-wheels", "--competition", "llm-comp", "--serve"]
    refused = CliRunner().invoke(app, kaggle)
    assert refused.exit_code == 1 and "folds are LoRA adapters on tiny/qwen" in refused.output, refused.output
    assert CliRunner().invoke(app, [*kaggle, "--model-dir", str(moved)]).exit_code == 0
    shipped = project / "kaggle" / "weights"
    assert sorted(p.name for p in (shipped / "base-model").iterdir()) == sorted(p.name for p in moved.iterdir())
    assert (shipped / "tokenizer").is_dir() and (shipped / "serve_defaults.json").is_file()
    notebook = (project / "kaggle" / "notebook.ipynb").read_text()
    assert "--model-dir={dataset('p-weights') / 'base-model'}" in notebook, notebook
    assert "ignore_patterns('dataset-metadata.json', 'base-model')" in notebook, notebook


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["reviews", "essays", "toxic"])
def test_a_llama_without_a_pad_token_reads_the_last_real_token(llms, tmp_path, layout):
    """Llama's tokenizer has no pad token and adds <s>: its EOS pads, on the right, and the score
    is the one the row gets alone. Binary, regression (two targets) and multilabel (six 0/1
    labels) train and submit; --quant 4bit without CUDA is one line and nothing written."""
    project = llm_project(tmp_path / "p", llms, layout, "llama")
    quant = run_script(project, "train.py", "--device", "cpu", "--quant", "4bit", check=False)
    out = (quant.stdout + quant.stderr).strip().splitlines()
    assert quant.returncode == 1 and out[-1].startswith("ERROR: --quant 4bit needs a CUDA GPU"), out
    assert not (project / "output").exists() or not list((project / "output").glob("*.pth"))
    log = dry_run_into_output(project, "--device", "cpu").stdout
    assert "pad none in the tokenizer: its EOS '</s>'; chat template off; LoRA on" in log, log[-2000:]
    assert "SUBMISSION:" in run_script(project, "predict.py").stdout
    sample = pd.read_csv(llms[layout] / "sample_submission.csv")
    sub = pd.read_csv(project / "output" / "submission.csv")
    assert list(sub.columns) == list(sample.columns) and sub.iloc[:, 1:].notna().all().all()
    if layout == "toxic":  # the heads' start (each label's share, a logit) is in the adapters' checkpoint
        start = torch.load(project / "output" / "model_fold0.pth", weights_only=True)["model"]["y_mean"]
        assert start.shape == (6,) and (start < 0).all(), start  # every share is under one half
        assert ((sub.iloc[:, 1:] > 0) & (sub.iloc[:, 1:] < 1)).all().all()
    if layout != "reviews":
        return
    m = import_project(project, ("train", "texts"))
    ckpt = torch.load(project / "output" / "model_fold0.pth", weights_only=True)
    model = m.train.build_model(ckpt["config"], ckpt["hf_config"], ckpt["classes"], llms["llama"]).eval()
    model.load_checkpoint_state(ckpt["model"])
    short, long = [0, 20, 21, 22], [0, *range(20, 40)]
    rows = m.texts.TextRows([torch.tensor(x).numpy() for x in (short, long)], None, ckpt["hf_config"]["pad_token_id"])
    ids, mask = m.texts.collate(rows, [0, 1])
    with torch.no_grad():
        batched = model(ids, mask)
        alone = model(torch.tensor([short]), torch.ones(1, len(short), dtype=torch.long))
    assert ids[0, -1] == ckpt["hf_config"]["pad_token_id"] and torch.allclose(batched[0], alone[0], atol=1e-5)


@pytest.mark.slow
def test_lora_on_the_minilm_encoder_saves_megabytes_not_the_model(llms, tmp_path):
    project = llm_project(tmp_path / "p", llms, "authors", "minilm")
    log = dry_run_into_output(project, "--device", "cpu", "--lora", "on", "--lora-r", "8").stdout
    assert "TEXT MODEL: an encoder (bert)" in log and "LoRA on" in log and "LORA: r 8, alpha 32" in log, log[-2000:]
    ckpt_bytes = (project / "output" / "model_fold0.pth").stat().st_size
    full_bytes = (minilm_dir() / "model.safetensors").stat().st_size
    assert ckpt_bytes < full_bytes / 10, (ckpt_bytes, full_bytes)
    state = torch.load(project / "output" / "model_fold0.pth", weights_only=True)["model"]
    assert adapter_keys_only(state) and any("classifier" in k for k in state)
    assert "SUBMISSION:" in run_script(project, "predict.py").stdout
