"""A run resumed with other weights behind the same model path is refused, not mixed:
``hf:`` policies record a content fingerprint of their weights (``drgym.models.weights_revision``)."""

from __future__ import annotations

import json
import shutil

import pytest


def _folder(path, files: dict[str, bytes], config: dict | None = None):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def test_weights_revision_follows_the_content_not_the_path(tmp_path, monkeypatch):
    import drgym.models as models

    a = _folder(tmp_path / "a", {"model.safetensors": b"\x01" * 1000, "notes.txt": b"x"})
    b = _folder(tmp_path / "b", {"model.safetensors": b"\x01" * 1000, "notes.txt": b"other",
                                 "training_args.bin": b"a trainer's arguments, not weights"})
    rev = models.weights_revision(str(a))
    assert rev is not None and len(rev) == 16
    assert models.weights_revision(str(b)) == rev  # another folder, same weights; other files do not count
    (b / "model.safetensors").write_bytes(b"\x01" * 999 + b"\x02")  # one byte retrained
    assert models.weights_revision(str(b)) != rev
    # a large file is read at its two ends: a change there is seen
    monkeypatch.setattr(models, "_FULL_HASH_BYTES", 100)
    monkeypatch.setattr(models, "_EDGE_BYTES", 10)
    r1 = models.weights_revision(str(a))
    (a / "model.safetensors").write_bytes(b"\x01" * 999 + b"\x03")
    assert models.weights_revision(str(a)) != r1
    assert models.weights_revision(str(_folder(tmp_path / "empty", {}))) is None
    assert models.weights_revision("some-org/some-hub-model") is None  # not local: transformers loads it


def test_an_adapter_fingerprint_covers_its_base(tmp_path):
    import drgym.models as models

    base1 = _folder(tmp_path / "base1", {"model.safetensors": b"base-one"})
    base2 = _folder(tmp_path / "base2", {"model.safetensors": b"base-two"})
    revs = []
    for base in (base1, base2):
        ad = tmp_path / f"adapter-on-{base.name}"
        ad.mkdir()
        (ad / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
        (ad / "adapter_model.safetensors").write_bytes(b"same adapter")
        revs.append(models.weights_revision(str(ad)))
    assert None not in revs and revs[0] != revs[1]


def test_resolved_settings_are_read_inside_wrapping_policies():
    from drgym.evaluation.run_directory import resolved_policy_settings

    rec = {"kind": "rtr", "agent": {"kind": "hf", "weights": "abc", "dtype": "float32", "model": "m"}}
    assert resolved_policy_settings(rec) == {"agent.weights": "abc", "agent.dtype": "float32"}


def test_resume_refuses_a_model_folder_retrained_in_place(tmp_path, bm25_backend):
    """The shipped adapter copied to a folder, one episode run, the folder's weights changed
    (as a training run writing its final model again would), then a resume: refused."""
    from safetensors.torch import load_file, save_file

    from drgym.envs.task_loaders import load_tasks
    from drgym.errors import ConfigError
    from drgym.evaluation.runner import RolloutConfig, run_rollout
    from drgym.models import packaged_adapter

    ad = tmp_path / "final"
    shutil.copytree(packaged_adapter("smollm2-drgym"), ad)
    tasks = load_tasks("hotpotqa-dev")[:2]
    rc = RolloutConfig(tasks="hotpotqa-dev", policy=f"hf:{ad}", n=1, out=str(tmp_path / "run"), max_turns=1,
                       env_options={"top_k": 2, "max_fetches": 0}, plots=False, rewards=[],
                       policy_options={"max_new_tokens": 8})
    run_rollout(rc, backend=bm25_backend, progress=False, tasks=tasks)
    first = json.loads((tmp_path / "run" / "config.json").read_text())["policy"]["weights"]
    assert first is not None
    w = load_file(str(ad / "adapter_model.safetensors"))
    k = sorted(w)[0]
    w[k] = w[k] * 1.01
    save_file(w, str(ad / "adapter_model.safetensors"))
    rc.n = 2
    with pytest.raises(ConfigError, match=r"weights=.*resuming would mix them\. The model's weights changed"):
        run_rollout(rc, backend=bm25_backend, progress=False, tasks=tasks)
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 1  # nothing of the refused session was written
