"""drgym on a Ray cluster of two nodes on one machine (``pip install 'drgym[distributed]'``).

The slow test runs ``scripts/ray_two_nodes.py`` (the run behind
``scripts/results/ray_two_nodes.json``): a head and a worker started as separate
``ray start`` processes with their own resources (``node_a``, ``node_b``, one CPU each),
``drgym index build --ray`` across both, ``drgym serve-ray`` with shard 0 on one node and
shard 1 on the other, the same requests to it and to ``drgym serve``, a shard replica
killed mid-serve and then its whole node, Ctrl-C, and the cluster stopped with none of its
processes left. About 4-6 minutes on 2 busy cores; without Ray it skips.

The fast tests check the per-shard settings of the serving config (no Ray needed).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from drgym.distributed.serve import check_fits, load_config, min_resources, shard_config
from drgym.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
HAVE_RAY = importlib.util.find_spec("ray") is not None

PINNED = {"shard": {"per_shard": {0: {"deployment": {"ray_actor_options": {"resources": {"node_a": 0.5}}}},
                                  "1": {"deployment": {"num_replicas": 1,
                                                       "ray_actor_options": {"resources": {"node_b": 0.5}}}}}}}


def test_per_shard_settings_merge_over_the_shard_section():
    cfg = load_config(overrides=PINNED)
    s0, s1, s2 = (shard_config(cfg, i)["deployment"] for i in range(3))
    assert s0["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 0, "resources": {"node_a": 0.5}}
    assert s0["autoscaling_config"]["min_replicas"] == 1  # the section's own settings stay
    assert s1["num_replicas"] == 1 and "autoscaling_config" not in s1  # one excludes the other, as in load_config
    assert s1["ray_actor_options"]["resources"] == {"node_b": 0.5}
    assert "resources" not in s2["ray_actor_options"] and "per_shard" not in shard_config(cfg, 2)


def test_check_fits_counts_custom_resources_and_refuses_missing_ones():
    cfg = load_config(overrides=PINNED)
    assert min_resources(cfg, 2) == {"CPU": 1.5, "GPU": 0.0, "node_a": 0.5, "node_b": 0.5}
    assert check_fits(cfg, 2, {"CPU": 2.0, "node_a": 1.0, "node_b": 1.0})["node_b"] == 0.5
    with pytest.raises(ConfigError, match=r"reserve 0\.5 of the custom resource 'node_b', the Ray cluster has 0"):
        check_fits(cfg, 2, {"CPU": 2.0, "node_a": 1.0})  # Ray would leave shard 1 pending and serve.run wait forever
    with pytest.raises(ConfigError, match=r"shard\.per_shard\['1'\]: the index has 1 shard"):
        check_fits(cfg, 1, {"CPU": 2.0, "node_a": 1.0, "node_b": 1.0})
    assert check_fits(load_config(), 2, {"CPU": 2.0}) == {"CPU": 1.5, "GPU": 0.0}


def _script():
    spec = importlib.util.spec_from_file_location("ray_two_nodes", REPO / "scripts" / "ray_two_nodes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'drgym[distributed]')")
def test_build_and_serve_ray_across_two_nodes(tmp_path):
    rec = _script().run(tmp_path)
    build, serve = rec["build"], rec["serve"]

    # the Ray build ran on both nodes and wrote the local build's files
    assert build["nodes_used_by_encoder_actors"] == ["node_a", "node_b"], build["encoder_actors"]
    assert build["equal_to_local_build"], build["difference"]
    assert build["output_line"].startswith("built: 994 documents, 1069 passages, 2 shard(s)")

    # each shard on its own node, as the config pins them (read back from Ray's state API)
    assert serve["shard_nodes"] == {"drgym-shard-0": "node_a", "drgym-shard-1": "node_b"}
    assert serve["encoder_backend"] == {"drgym serve": "onnx", "drgym serve-ray": "onnx"}  # the config reached the router
    cmp = serve["vs_drgym_serve"]
    assert cmp["all_status_200"] and cmp["same_ids_in_order"] and cmp["partial_answers"] == 0, cmp
    assert cmp["hits"] >= 150 and cmp["max_abs_score_diff"] <= 1e-5, cmp
    assert serve["fetch_bodies_equal"] == serve["fetched_urls"] > 10

    # a killed shard replica: partial answers naming shard 1, then a new replica on node_b
    one_shard = ['{"missing_shards": [1], "shards": 2}']
    replica = serve["kill"]["replica"]
    assert replica["non_200"] == 0 and replica["partial_answers"] >= 1, replica
    assert replica["partial_fields_seen"] == one_shard, replica
    assert [r["node"] for r in replica["new_replica"]] == ["node_b"] and replica["answers_after_equal_before"]
    # the worker node killed: partial answers while no node offers node_b; shard 1 back on a new node_b
    node = serve["kill"]["node"]
    assert node["while_down"]["partial_answers"] == node["while_down"]["answers"] >= 1, node
    assert node["while_down"]["partial_fields_seen"] == one_shard and node["while_down"]["non_200"] == 0, node
    assert [r["node"] for r in node["after_new_node"]["new_replica"]] == ["node_b"], node
    assert node["after_new_node"]["non_200"] == 0 and node["answers_after_equal_before"], node

    # Ctrl-C removes what serve-ray deployed; stopping the cluster leaves no process behind
    assert serve["ctrl_c_exit_status"] == 0 and serve["serve_actors_alive_after_ctrl_c"] == []
    assert rec["cluster_processes_left"] == []
