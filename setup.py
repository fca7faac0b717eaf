from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
requirements = [
    line.split("#")[0].strip()
    for line in (here / "requirements.txt").read_text().splitlines()
    if line.split("#")[0].strip()
]

setup(
    name="swarm-gdrive",
    version="0.1.0",
    description="Decentralized RL post-training (GRPO + SAPO) of small language models over a shared folder",
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["swarm_gdrive", "swarm_gdrive.*"]),
    # the presets are data (swarm_gdrive/presets/*.json), read by the package at run time
    package_data={"swarm_gdrive.presets": ["*.json"]},
    python_requires=">=3.10",
    install_requires=requirements,
    extras_require={
        # trl: the reference GRPO implementation the loss is tested against (not needed at run time).
        # s3fs + moto: the S3 backend tested against moto's S3 server on 127.0.0.1.
        # papermill/nbclient/ipykernel: every notebook is executed headless in the tests.
        # hypothesis: the fuzzer of every decoder and reader of the shared folder (tests/faults, tests/unit).
        # import-linter (2.17+ has acyclic_siblings): the floors of pyproject.toml, in tests/unit/test_layering.py.
        # oauth2client/PyYAML/funcy/appdirs/tqdm: what PyDrive2 imports; PyDrive2 itself is installed with
        # --no-deps by the README's test command (its cryptography<44 pin conflicts with moto's joserfc).
        "test": [
            # <9.2: pytest 9.2 keeps a node's id in Node._id, and pytest-xdist 3.8's --dist loadgroup still renames
            # item._nodeid, so xdist_group marks group nothing there: the module fixtures they share (the GGUF
            # conversion, the SAPO study notebook's Drive) would be built once on every worker that runs one.
            "pytest>=8,<9.2",
            "pytest-timeout>=2.3",
            # the suite runs on several workers (pyproject's addopts): most of its time is waiting (processes,
            # lags, deadlines), not CPU, so a 2-core CI machine runs it in well under half the serial time
            "pytest-xdist>=3.6",
            "import-linter>=2.17,<3",
            "hypothesis>=6.100",
            "ruff>=0.6",
            "trl>=1.16,<2",
            "s3fs>=2024.2",
            "moto[server]>=5",
            "papermill>=2.6",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6",
            "oauth2client>=4.1.3",
            "PyYAML>=6",
            "funcy>=1.14",
            "appdirs>=1.4.3",
            "tqdm>=4",
            # playwright drives Debian's chromium (no browser download) in the web dashboard's test
            "playwright>=1.40",
            # every REPORT_TO tracker is exercised offline (tests/unit/test_tracking.py, the swarm test)
            "tensorboard>=2.14",
            "wandb>=0.19",
            "trackio>=0.43,<1",
            # TASK_SOURCE=datasets (the "datasets" extra below), tested in tests/unit/test_dataset_task.py
            "datasets>=3",
            "math-verify>=0.7",
        ],
        # TASK_SOURCE=datasets: a Hugging Face dataset and math-verify's answer check (docs/tasks.md). An extra, not a
        # requirement: datasets 5 needs huggingface-hub 1.x, which would upgrade Colab's transformers on install.
        "datasets": ["datasets>=3", "math-verify>=0.7"],
        # REPORT_TO's trackers. wandb: 0.19 brought init(reinit="create_new"); trackio: before 1.0 its init's
        # keywords move between releases, and 0.43 is the one tested (group, resume, embed, auto_log_cpu).
        "tensorboard": ["tensorboard>=2.14"],
        "wandb": ["wandb>=0.19"],
        "trackio": ["trackio>=0.43,<1"],
        "s3": ["s3fs>=2024.2"],
        "gcs": ["gcsfs>=2024.2"],
    },
    entry_points={"console_scripts": ["swarm-gdrive=swarm_gdrive.cli:main"]},
)
