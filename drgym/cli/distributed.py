"""``drgym serve-ray``: serve an index sharded over a Ray cluster (``drgym[distributed]``).

The distributed build is ``drgym index build --ray`` (in :mod:`drgym.cli.index`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def serve_ray(
    index_dir: str = typer.Option(..., "--index-dir", help="Index folder (or name under $DRGYM_HOME/indexes) to serve, one Serve application per dense shard."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML overriding drgym/distributed/serve.yaml (replicas, autoscaling, timeouts, method, server settings)."),
    method: Optional[str] = typer.Option(None, help="dense, bm25 or hybrid (default: the config's, hybrid)."),
    host: str = typer.Option("127.0.0.1", help="Address of Ray Serve's HTTP proxy."),
    port: int = typer.Option(8000, help="TCP port of Ray Serve's HTTP proxy."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (default: start a local one)."),
    num_cpus: Optional[int] = typer.Option(None, "--num-cpus", help="CPUs of the local Ray cluster started here (default: all cores); with --ray-address, each node's `ray start --num-cpus` sets them."),
) -> None:
    """Serve an index sharded on Ray Serve behind the same /search, /fetch, /retrieve API as drgym serve; Ctrl-C stops it."""
    import time

    from drgym.distributed import require_ray
    from drgym.distributed.serve import deploy, load_config, undeploy
    from drgym.errors import ConfigError, DrgymError
    from drgym.paths import indexes_dir

    try:
        if num_cpus is not None and num_cpus < 1:
            raise ConfigError(f"--num-cpus must be at least 1, got {num_cpus}.")
        if num_cpus is not None and ray_address is not None:
            raise ConfigError(f"--num-cpus sets the CPUs of a local cluster started here, not of the cluster at "
                              f"--ray-address {ray_address}: its nodes set theirs with `ray start --num-cpus N`.")
        ray = require_ray()
        folder = Path(index_dir).expanduser()
        if not (folder / "manifest.json").exists() and (indexes_dir() / index_dir / "manifest.json").exists():
            folder = indexes_dir() / index_dir
        cfg = load_config(config, {"router": {"method": method}} if method else None)
        init = {"num_cpus": num_cpus} if num_cpus is not None else {}
        ray.init(address=ray_address, include_dashboard=False, **init)
    except DrgymError as e:
        typer.echo(f"drgym serve-ray: error: {e}", err=True)
        if "ray" in locals() and ray.is_initialized():
            ray.shutdown()
        raise typer.Exit(2) from None
    # From here on, every way out (Ctrl-C during the deployment included) removes the
    # applications deployed so far: Ray Serve keeps them on the cluster after this process.
    code = 0
    try:
        url = deploy(folder, cfg, host=host, port=port)
        typer.echo(f"drgym serve-ray: {folder} on {url} (Ctrl-C stops)", err=True)
        while True:
            time.sleep(3600)
    except DrgymError as e:
        typer.echo(f"drgym serve-ray: error: {e}", err=True)
        code = 2
    except KeyboardInterrupt:
        typer.echo("drgym serve-ray: stopping: removing the deployed applications", err=True)
    finally:
        try:
            undeploy(folder, cfg)
        finally:
            ray.shutdown()
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``drgym serve-ray`` to ``app``."""
    app.command("serve-ray")(serve_ray)
