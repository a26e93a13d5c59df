"""``drgym index ...`` commands: build, info and list indexes."""

from __future__ import annotations

import json
from pathlib import Path

import typer

index_app = typer.Typer(help="Build and inspect search indexes.", no_args_is_help=True)


@index_app.command("build")
def build(
    corpus: str = typer.Option("wiki-default", "--corpus", "-c", help="Named corpus (wiki-default, hotpotqa, ...) or a corpus file/folder."),
    format: str = typer.Option(None, "--format", help="Corpus format for a path: wiki18, web, clueweb22, hipporag, ovos, drgym (default: sniffed)."),
    encoder: str = typer.Option("all-MiniLM-L6-v2", "--encoder", "-e", help="sentence-transformers model name or local path."),
    factory: str = typer.Option(None, "--factory", help="FAISS index_factory string: Flat (default), HNSW32, IVF256,PQ32 ..."),
    shard_size: int = typer.Option(None, "--shard-size", help="Rows per dense shard (default 25,000,000)."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Passage window in encoder tokens (default: encoder window - 32; 0 = no split)."),
    overlap: int = typer.Option(32, "--overlap", help="Tokens shared by consecutive windows."),
    no_bm25: bool = typer.Option(False, "--no-bm25", help="Skip the BM25 index."),
    name: str = typer.Option(None, "--name", help="Index folder name (default: derived from corpus, encoder, factory)."),
    root: Path = typer.Option(None, "--root", help="Folder of index folders (default: $DRGYM_HOME/indexes)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if an identical index exists."),
) -> None:
    """Build an index (docstore, FAISS shards, BM25); reuses an identical existing one."""
    import time

    from drgym.errors import DrgymError
    from drgym.index.build import DEFAULT_FACTORY, DEFAULT_SHARD_SIZE, IndexSpec, build_index

    t0 = time.perf_counter()
    spec = IndexSpec(corpus=corpus, format=format, encoder=encoder, factory=factory or DEFAULT_FACTORY,
                     shard_size=shard_size or DEFAULT_SHARD_SIZE, max_tokens=max_tokens, overlap=overlap,
                     bm25=not no_bm25, name=name)
    try:
        res = build_index(spec, root=root, force=force, progress=True)
    except DrgymError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from e
    m = res.manifest
    typer.echo(f"index: {res.folder}")
    typer.echo(f"{'built' if res.built else 'up to date (not rebuilt)'}: {m.n_documents} documents, {m.n_passages} passages, "
               f"{len(m.shards)} shard(s), factory {m.factory}, encoder {m.encoder}@{m.encoder_revision}")
    if res.built:
        typer.echo("timings (s): " + ", ".join(f"{k} {v}" for k, v in m.timings.items()))
    typer.echo(f"total: {time.perf_counter() - t0:.1f} s")


@index_app.command("info")
def info(index: str = typer.Argument(..., help="Index folder or name under $DRGYM_HOME/indexes.")) -> None:
    """Print an index's manifest (JSON)."""
    from drgym.index.manifest import IndexManifest
    from drgym.paths import indexes_dir

    p = Path(index)
    if not (p / "manifest.json").exists():
        p = indexes_dir() / index
    typer.echo(json.dumps(IndexManifest.read(p).to_dict(), indent=2, ensure_ascii=False))


@index_app.command("list")
def list_indexes() -> None:
    """List the indexes under $DRGYM_HOME/indexes."""
    from drgym.errors import DrgymError
    from drgym.index.manifest import IndexManifest
    from drgym.paths import indexes_dir

    for p in sorted(indexes_dir().iterdir()):
        if p.name.startswith(".") or not p.is_dir():
            continue
        try:
            m = IndexManifest.read(p)
            typer.echo(f"{p.name}\t{m.n_passages} passages\t{m.factory}\t{m.encoder}\t{m.created}")
        except DrgymError as e:
            typer.echo(f"{p.name}\tunreadable: {e}")


def register(app: typer.Typer) -> None:
    """Add ``drgym index`` to ``app``."""
    app.add_typer(index_app, name="index")
