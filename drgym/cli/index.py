"""``drgym index ...`` commands: build, import, info, calibrate, verify and list indexes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

index_app = typer.Typer(help="Build and inspect search indexes.", no_args_is_help=True,
                        rich_markup_mode=None)  # plain help: "drgym[distributed]" is not rich markup


@index_app.command("build")
def build(
    corpus_arg: Optional[str] = typer.Argument(None, metavar="CORPUS", show_default=False,
                                               help="Named corpus (wiki-default, hotpotqa, ...) or a corpus file/folder; the same as --corpus."),
    corpus: Optional[str] = typer.Option(None, "--corpus", "-c", show_default=False,
                                         help="Named corpus (wiki-default, hotpotqa, ...) or a corpus file/folder (default wiki-default)."),
    format: str = typer.Option(None, "--format", help="Corpus format for a path: wiki18, web, clueweb22, browsecomp-plus, hipporag, ovos, drgym (default: sniffed)."),
    encoder: str = typer.Option("all-MiniLM-L6-v2", "--encoder", "-e", help="sentence-transformers model name or local path."),
    factory: str = typer.Option(None, "--factory", help="FAISS index_factory string (Flat, HNSW32, IVF4096,PQ48 ...) or auto (default: Flat up to 1M passages, IVF-PQ beyond)."),
    shard_size: int = typer.Option(None, "--shard-size", help="Rows per dense shard (default 25,000,000)."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Passage window in encoder tokens (default: encoder window - 32; 0 = no split)."),
    overlap: int = typer.Option(32, "--overlap", help="Tokens shared by consecutive windows."),
    no_bm25: bool = typer.Option(False, "--no-bm25", help="Skip the BM25 index."),
    bm25_engine: str = typer.Option("bm25s", "--bm25-engine", help="bm25s (in memory, fastest) or fts5 (SQLite FTS5 on disk: bounded memory at any size, e.g. wiki-18)."),
    name: str = typer.Option(None, "--name", help="Index folder name (default: derived from corpus, encoder, factory)."),
    root: Path = typer.Option(None, "--root", help="Folder of index folders (default: $DRGYM_HOME/indexes)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if an identical index exists."),
    chunk_docs: int = typer.Option(None, "--chunk-docs", help="Documents per build unit, the resumption step (default 10,000)."),
    no_resume: bool = typer.Option(False, "--no-resume", help="Discard a partial build left by a killed run instead of resuming it."),
    target_recall: float = typer.Option(0.95, "--target-recall", help="IVF indexes: record the smallest nprobe whose recall@10 on question-like queries reaches this with 95% confidence (0: a quarter of the lists)."),
    queries_file: Path = typer.Option(None, "--queries-file", help="IVF indexes: the queries that calibration measures with, a text file of one query a line or a .npy of float32 (n, dim) vectors (default: drgym's shipped NQ-open and HippoRAG questions when the encoder is the shipped MiniLM, else the index's own rows)."),
    wikipedia_urls: bool = typer.Option(False, "--wikipedia-urls", help="The corpus is Wikipedia (wiki18 or hipporag rows): a row without a url gets the Wikipedia URL of its title (default: no URL is made up; the document is shown and fetched as drgym://doc/<id>)."),
    ray: bool = typer.Option(False, "--ray", help="Encode units and build shards on a Ray cluster (pip install 'drgym[distributed]')."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster address (default: start or join a local one)."),
) -> None:
    """Build an index (docstore, FAISS shards, BM25), streamed unit by unit; reuses an identical existing one and resumes a killed build.

    The corpus is given as an argument or with --corpus: drgym index build my.jsonl --format wiki18
    """
    import time

    from drgym.errors import DrgymError
    from drgym.index.build import DEFAULT_FACTORY, DEFAULT_SHARD_SIZE, IndexSpec, build_index
    from drgym.index.units import CHUNK_DOCS

    t0 = time.perf_counter()
    if corpus_arg and corpus and corpus_arg != corpus:
        typer.secho(f"error: two corpora given: {corpus_arg!r} and --corpus {corpus!r}; give one.", fg="red", err=True)
        raise typer.Exit(2)
    corpus = corpus_arg or corpus or "wiki-default"
    spec = IndexSpec(corpus=corpus, format=format, encoder=encoder, factory=factory or DEFAULT_FACTORY,
                     shard_size=shard_size or DEFAULT_SHARD_SIZE, max_tokens=max_tokens, overlap=overlap,
                     bm25=not no_bm25, name=name, chunk_docs=chunk_docs or CHUNK_DOCS, bm25_engine=bm25_engine,
                     target_recall=target_recall, queries_file=str(queries_file) if queries_file else None,
                     wikipedia_urls=wikipedia_urls)
    runner = None
    try:
        if ray:
            from drgym.distributed.build import RayRunner

            runner = RayRunner(address=ray_address)
        res = build_index(spec, root=root, force=force, progress=True, resume=not no_resume, runner=runner)
    except DrgymError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from e
    finally:
        if runner is not None:
            runner.close()
    _report(res, t0)


def _report(res, t0: float) -> None:
    import time

    m = res.manifest
    typer.echo(f"index: {res.folder}")
    typer.echo(f"{'built' if res.built else 'up to date (not rebuilt)'}: {m.n_documents} documents, {m.n_passages} passages, "
               f"{len(m.shards)} shard(s), factory {m.factory}, encoder {m.encoder}@{m.encoder_revision}")
    if res.built:
        if res.resumed_units:
            typer.echo(f"resumed: {res.resumed_units} unit(s) came from a partial build")
        typer.echo("timings (s): " + ", ".join(f"{k} {v}" for k, v in m.timings.items()))
    typer.echo(f"total: {time.perf_counter() - t0:.1f} s")


@index_app.command("import")
def import_cmd(
    corpus: Path = typer.Argument(..., help="Corpus file or folder; row i is vector i (wiki-18 JSONL {id, contents}, parquet, any drgym format)."),
    encoder: str = typer.Option(..., "--encoder", "-e", help="The model that made the vectors (name or local path); queries are encoded with it."),
    faiss_index: Path = typer.Option(None, "--faiss", help="An existing FAISS index file (inner product), e.g. Search-R1's e5_Flat.index."),
    embeddings: list[Path] = typer.Option(None, "--embeddings", help=".npy embedding shards in corpus order (repeat the option, or give a folder of .npy files)."),
    format: str = typer.Option(None, "--format", help="Corpus format (default: sniffed; wiki18 for {id, contents} rows)."),
    factory: str = typer.Option("auto", "--factory", help="FAISS factory for --embeddings (default auto); an imported --faiss index is kept as is."),
    shard_size: int = typer.Option(None, "--shard-size", help="Rows per dense shard for --embeddings (default 25,000,000)."),
    no_bm25: bool = typer.Option(False, "--no-bm25", help="Skip the BM25 index."),
    bm25_engine: str = typer.Option("bm25s", "--bm25-engine", help="bm25s (in memory, fastest) or fts5 (SQLite FTS5 on disk: bounded memory at any size, e.g. wiki-18)."),
    name: str = typer.Option(None, "--name", help="Index folder name (default: derived from corpus, encoder, factory)."),
    root: Path = typer.Option(None, "--root", help="Folder of index folders (default: $DRGYM_HOME/indexes)."),
    link: str = typer.Option("auto", "--link", help="How the FAISS file enters the index: auto (hard link, else copy), hardlink, copy, symlink."),
    force: bool = typer.Option(False, "--force", help="Import again even if an identical index exists."),
    no_resume: bool = typer.Option(False, "--no-resume", help="Discard a partial import instead of resuming it."),
    target_recall: float = typer.Option(0.95, "--target-recall", help="IVF indexes: record the smallest nprobe whose recall@10 on the index's own rows reaches this with 95% confidence (0: a quarter of the lists)."),
    id_prefix: str = typer.Option("", "--id-prefix", help="Put this in front of every row id (default: the corpus's ids as they are, e.g. Search-R1's passage ids)."),
    wikipedia_urls: bool = typer.Option(False, "--wikipedia-urls", help="The corpus is Wikipedia, as Search-R1's wiki-18 is: a row without a url gets the Wikipedia URL of its title (default: no URL is made up; the document is shown and fetched as drgym://doc/<id>)."),
) -> None:
    """Import a corpus plus its ready-made vectors (a FAISS index or .npy shards): writes the docstore, manifest and BM25; nothing is re-encoded. Passage ids are the corpus's own."""
    import time

    from drgym.errors import DrgymError
    from drgym.index.build import DEFAULT_SHARD_SIZE
    from drgym.index.importer import import_index

    t0 = time.perf_counter()
    files = None
    if embeddings:
        files = []
        for p in embeddings:
            files.extend(sorted(p.glob("*.npy")) if p.is_dir() else [p])
    try:
        res = import_index(corpus, encoder=encoder, faiss_index=faiss_index, embeddings=files, format=format,
                           factory=factory, shard_size=shard_size or DEFAULT_SHARD_SIZE, bm25=not no_bm25, name=name,
                           root=root, link=link, force=force, resume=not no_resume, progress=True,
                           id_prefix=id_prefix, bm25_engine=bm25_engine, target_recall=target_recall,
                           wikipedia_urls=wikipedia_urls)
    except DrgymError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from e
    _report(res, t0)


@index_app.command("info")
def info(index: str = typer.Argument(..., help="Index folder or name under $DRGYM_HOME/indexes.")) -> None:
    """Print an index's manifest (JSON)."""
    from drgym.index.manifest import IndexManifest
    from drgym.paths import indexes_dir

    p = Path(index)
    if not (p / "manifest.json").exists():
        p = indexes_dir() / index
    typer.echo(json.dumps(IndexManifest.read(p).to_dict(), indent=2, ensure_ascii=False))


@index_app.command("calibrate")
def calibrate(
    index: str = typer.Argument(..., help="Index folder, name under $DRGYM_HOME/indexes, or corpus name when one built index matches."),
    target_recall: float = typer.Option(0.95, "--target-recall", help="recall@10 on the calibration queries that the recorded nprobe must reach with 95% confidence."),
    queries: int = typer.Option(200, "--queries", help="Rows drawn as queries."),
    queries_file: Path = typer.Option(None, "--queries-file", help="Measure on your own queries: a text file, one query a line (encoded with the index's query encoder), or a .npy of float32 (n, dim) query vectors (default: drgym's shipped NQ-open and HippoRAG questions when the index's encoder is the shipped MiniLM, else the index's own rows)."),
    own_rows: bool = typer.Option(False, "--own-rows", help="Measure on the index's own rows as queries, even where shipped questions apply."),
) -> None:
    """Measure an IVF index's recall curve on question-like queries and record the smallest nprobe reaching --target-recall (with 95% confidence) in its manifest; every search of it then starts from that nprobe. The manifest's calibration.source says which queries: queries-file, shipped-questions or rows."""
    from drgym.errors import ConfigError, DrgymError
    from drgym.index.calibrate import calibrate_nprobe
    from drgym.index.manifest import IndexManifest
    from drgym.search.local import resolve_index_folder

    try:
        folder = resolve_index_folder(index)
        m = IndexManifest.read(folder)
        if own_rows and queries_file is not None:
            raise ConfigError("--own-rows and --queries-file both say which queries to measure on; give one.")
        vectors, source = None, {"source": "rows"}
        if not own_rows:
            vectors, source = _query_vectors(queries_file, folder)
        cal = calibrate_nprobe(folder, m.shards, m.dim, m.n_passages, target=target_recall, queries=queries,
                               query_vectors=vectors)
        if cal is None:
            raise ConfigError(f"index {m.name} (factory {m.factory}) is not an IVF index with stored float16 rows: "
                              "nothing to calibrate.")
        cal.update(source)
        m.calibration = cal
        m.write(folder)
    except DrgymError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from e
    curve = ", ".join(f"{p['nprobe']}: {p['recall']:.3f}" for p in cal["curve"])
    typer.echo(f"{'ok' if cal['reached'] else 'not reached'}: index {m.name}: nprobe {cal['search_params']['nprobe']} "
               f"of {cal['nlist']} lists, recall@{cal['k']} {cal['recall']:.3f} ({cal['recall_low']:.3f} with 95% "
               f"confidence) on {cal['queries']} {_SOURCE_WORDS[cal['source']]} "
               f"(target {cal['target_recall']}; curve {curve}; {cal['seconds']:.1f} s)")
    if not cal["reached"]:
        raise typer.Exit(1)


_SOURCE_WORDS = {"rows": "of its rows", "queries-file": "given queries", "shipped-questions": "shipped questions"}


def _query_vectors(path: Path | None, folder: Path):
    """``(vectors or None, record)`` of :func:`drgym.index.calibrate.calibration_queries`
    for the index in ``folder``: ``path``'s queries (a ``.npy`` of vectors, or text encoded
    with the index's query encoder), else the shipped questions when the index's encoder is
    the shipped MiniLM, else None (its rows). ConfigError for a missing or empty file."""
    from types import SimpleNamespace

    from drgym.index.calibrate import calibration_queries, is_shipped_encoder
    from drgym.index.manifest import IndexManifest
    from drgym.search.local import LocalSearchEngine

    if path is not None and path.suffix == ".npy":
        return calibration_queries(None, path)
    m = IndexManifest.read(folder)
    if path is None and not is_shipped_encoder(SimpleNamespace(name=m.encoder, revision=m.encoder_revision)):
        return calibration_queries(None, None)  # the rows: no model to load
    engine = LocalSearchEngine.open(folder, method="dense")
    try:
        return calibration_queries(engine.encoder, path)
    finally:
        engine.close()


@index_app.command("verify")
def verify(
    index: str = typer.Argument(..., help="Index folder, name under $DRGYM_HOME/indexes, or corpus name when one built index matches."),
    quick: bool = typer.Option(False, "--quick", help="Check the sampled checksums (as loading does) instead of hashing every byte."),
) -> None:
    """Check every file of an index against the sizes and checksums in its manifest: one line per bad file, exit 1 if any."""
    import time

    from drgym.errors import DrgymError
    from drgym.index.manifest import CHECKSUM_ALGORITHM, IndexManifest
    from drgym.search.local import resolve_index_folder

    t0 = time.perf_counter()
    try:
        folder = resolve_index_folder(index)
        m = IndexManifest.read(folder)
        problems = m.file_problems(folder, "sample" if quick else "full")
    except DrgymError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from e
    for rel, problem in problems:
        typer.echo(f"bad: {folder / rel} {problem}")
    has_sums = isinstance(m.checksums, dict) and bool(m.checksums.get("files"))
    checked = "sizes only: the manifest has no checksums (built by an older drgym)" if not has_sums \
        else f"sizes and {'sampled' if quick else 'full'} {CHECKSUM_ALGORITHM} checksums"
    own = m.manifest_problems(getattr(m, "_raw", None))
    if own:  # the files were not checked against a manifest that is itself bad
        typer.secho(f"error: index {m.name} at {folder}: its manifest is bad ({len(own)} problem(s)); the files "
                    "cannot be checked against it: rebuild it with `drgym index build --force` and the options it "
                    f"was built with (corpus {m.corpus}, factory {m.factory}).", fg="red", err=True)
        raise typer.Exit(1)
    if problems:
        typer.secho(f"error: index {m.name} at {folder}: {len(problems)} of {len(m.files)} files are bad ({checked}); "
                    "rebuild it with `drgym index build --force` and the options it was built with "
                    f"(corpus {m.corpus}, factory {m.factory}).", fg="red", err=True)
        raise typer.Exit(1)
    mib = sum(m.files.values()) / 2**20
    typer.echo(f"ok: index {m.name} at {folder}: {len(m.files)} files, {mib:.1f} MiB, {checked} match "
               f"({time.perf_counter() - t0:.1f} s)")
    if not has_sums:
        typer.echo("note: rebuild the index (drgym index build --force) to record checksums.")
    elif not m.fields_protected:
        typer.echo("note: the manifest's own fields (shard layout, counts, encoder...) are not checksummed: it was "
                   "written by an older drgym; only their layout is checked. Rebuild the index (drgym index build "
                   "--force) to protect them.")


@index_app.command("list")
def list_indexes(
    root: Path = typer.Option(None, "--root", help="Folder of index folders (default: $DRGYM_HOME/indexes)."),
) -> None:
    """List the indexes under $DRGYM_HOME/indexes (or --root): passages, FAISS factory, BM25 engine, encoder, date."""
    from drgym.errors import DrgymError
    from drgym.index.manifest import IndexManifest
    from drgym.paths import indexes_dir

    from drgym.index.build import BUILD_PREFIX, bm25_engine_of

    folder = Path(root).expanduser() if root is not None else indexes_dir()
    if not folder.is_dir():
        typer.secho(f"error: {folder} is not a folder of indexes.", fg="red", err=True)
        raise typer.Exit(2)
    for p in sorted(folder.iterdir()):
        if p.name.startswith(BUILD_PREFIX) and p.is_dir():
            typer.echo(f"{p.name[len(BUILD_PREFIX):]}\tpartial build (killed or running): rerun the same build to resume it")
            continue
        if p.name.startswith(".") or not p.is_dir():
            continue
        try:
            m = IndexManifest.read(p)
            bm25 = f"BM25 {bm25_engine_of(m.bm25)}" if m.bm25 is not None else "no BM25"
            typer.echo(f"{p.name}\t{m.n_passages} passages\t{m.factory}\t{bm25}\t{m.encoder}\t{m.created}")
        except DrgymError as e:
            typer.echo(f"{p.name}\tunreadable: {e}")


def register(app: typer.Typer) -> None:
    """Add ``drgym index`` to ``app``."""
    app.add_typer(index_app, name="index")
