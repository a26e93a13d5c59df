"""``drgym search`` and ``drgym fetch``: query a local index (or a drgym server)."""

from __future__ import annotations

import typer
import typer.core
import typer.main


def _backend(corpus: str, index: str | None, method: str, server: str | None, collapse: str | None = None,
             verify: bool = False):
    if server:
        from drgym.search.client import HTTPSearchClient

        return HTTPSearchClient(server, collapse=collapse)
    from drgym.search.local import LocalSearchEngine

    kw = {"collapse": collapse} if collapse else {}
    if verify:
        kw["verify"] = True
    if index:
        return LocalSearchEngine.open(index, method=method, **kw)
    return LocalSearchEngine.from_corpus(corpus, method=method, progress=True, **kw)


class _SearchCommand(typer.core.TyperCommand):
    """``drgym search QUERY``, and ``drgym search eval ...`` handed to :func:`search_eval`."""

    def make_context(self, info_name, args, parent=None, **extra):
        if args[:1] == ["eval"]:
            return typer.main.get_command(_eval_app).make_context("search eval", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


_eval_app = typer.Typer(add_completion=False, rich_markup_mode=None)


@_eval_app.command()
def search_eval(
    qrels: str = typer.Option(..., "--qrels", help="TREC qrels: 'qid 0 docid rel' per line."),
    queries: str = typer.Option(..., "--queries", help="Queries: TSV 'qid<TAB>query' or JSONL {\"qid\", \"query\"}."),
    method: str = typer.Option("hybrid", "--method", "-m", help="dense, bm25, hybrid, or several comma-separated."),
    corpus: str = typer.Option("wiki-default", "--corpus", "-c", help="Named corpus or path; its index is built if missing."),
    index: str = typer.Option(None, "--index", help="An existing index (instead of --corpus)."),
    run_out: str = typer.Option(None, "--run-out", help="TREC run file to write (one per method: <stem>.<method><suffix>)."),
    out: str = typer.Option(None, "--out", help="Metrics JSON to write (overall and per query)."),
    k: int = typer.Option(100, "-k", "--k", help="Documents ranked per query (1..100); recall@100 needs 100."),
) -> None:
    """Rank the top 100 documents of each query and score them against qrels:
    recall@5/10/100, nDCG@10 and MRR@10 (ir-measures), per query and overall."""
    import json

    from drgym.errors import BadQueryError, DrgymError, unknown_name
    from drgym.evaluation.retrieval import evaluate_engine, read_qrels, read_queries
    from drgym.search.local import METHODS

    try:
        methods = [m.strip() for m in method.split(",") if m.strip()]
        for m in methods or [method]:
            if m not in METHODS:
                raise unknown_name("search method", m, METHODS)
        if not 1 <= k <= 100:
            raise BadQueryError(f"k must be between 1 and 100, got {k}.")
        judgements, texts = read_qrels(qrels), read_queries(queries)
        engine = _backend(corpus, index, methods[0], None)
        res = evaluate_engine(engine, judgements, texts, methods, run_out=run_out, out=out, k=k)
    except DrgymError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps({m: {"overall": r["overall"], "judged_queries": r["judged_queries"]}
                           for m, r in res["methods"].items()}, indent=2))


def register(app: typer.Typer) -> None:
    """Add ``drgym search`` (with ``drgym search eval``) and ``drgym fetch`` to ``app``."""

    @app.command("search", cls=_SearchCommand)
    def search(
        query: str = typer.Argument(..., help="The query text."),
        k: int = typer.Option(5, "-k", "--k", help="Number of results (1..100)."),
        method: str = typer.Option(None, "--method", "-m", help="dense, bm25 or hybrid (default: the engine's default)."),
        corpus: str = typer.Option("wiki-default", "--corpus", "-c", help="Named corpus or path; its index is built if missing."),
        index: str = typer.Option(None, "--index", help="An existing index: folder, name, or corpus name when one built index matches (instead of --corpus)."),
        server: str = typer.Option(None, "--server", help="Query a drgym server at this base URL instead."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        width: int = typer.Option(160, "--width", help="Characters of passage text shown."),
        collapse: str = typer.Option(None, "--collapse", help="document (k distinct documents, each its best passage; the default) or passage (k best passages)."),
        verify: bool = typer.Option(False, "--verify", help="Check the full checksum of every index file before searching (default: sizes and sampled checksums)."),
    ) -> None:
        """Search and print the top-k documents (or passages) as a table.

        drgym search eval --qrels FILE --queries FILE scores the engine against relevance judgements.
        """
        import json

        from rich.console import Console
        from rich.table import Table

        from drgym.errors import BadQueryError, DrgymError, unknown_name
        from drgym.search.base import check_collapse
        from drgym.search.local import DEFAULT_METHOD, METHODS

        try:
            # checked before the index and the encoder load (the backend checks k <= max_k)
            if k < 1:
                raise BadQueryError(f"k must be between 1 and the backend's max_k (100 locally), got {k}.")
            if not query.strip():
                raise BadQueryError("the query is empty: a query needs at least one non-space character.")
            if method is not None and method not in METHODS:
                raise unknown_name("search method", method, METHODS)
            if collapse is not None:
                check_collapse(collapse)
            backend = _backend(corpus, index, method or DEFAULT_METHOD, server, collapse, verify)
            results = backend.search(query, k)
        except DrgymError as e:
            typer.secho(f"error: {e}", fg="red", err=True)
            raise typer.Exit(2) from e
        if as_json:
            typer.echo(json.dumps([r.to_dict() for r in results], indent=2, ensure_ascii=False))
            return
        table = Table(title=f"{query!r}: top {len(results)} ({getattr(backend, 'method', backend.name)})")
        for col, kw in (("#", {"justify": "right"}), ("score", {"justify": "right"}), ("doc_id", {}), ("title", {}),
                        ("passage", {"overflow": "fold"}), ("url", {"overflow": "fold"})):
            table.add_column(col, **kw)
        for r in results:
            text = r.text if len(r.text) <= width else r.text[: width - 1] + "…"
            table.add_row(str(r.rank), f"{r.score:.4f}", r.doc_id, r.title, text, r.url)
        Console(markup=False).print(table)  # titles and passages as they are: '[1]' is not markup

    @app.command("fetch")
    def fetch(
        url: str = typer.Argument(..., help="Document URL (exact or normalised)."),
        corpus: str = typer.Option("wiki-default", "--corpus", "-c", help="Named corpus or path."),
        index: str = typer.Option(None, "--index", help="An existing index: folder, name, or corpus name when one built index matches."),
        server: str = typer.Option(None, "--server", help="Fetch from a drgym server at this base URL."),
        as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
    ) -> None:
        """Print the whole document at URL."""
        import json

        from drgym.errors import DocumentNotFoundError, DrgymError

        try:
            doc = _backend(corpus, index, "bm25", server).fetch(url)
        except DocumentNotFoundError as e:
            typer.secho(f"error: {e}", fg="red", err=True)
            raise typer.Exit(1) from e
        except DrgymError as e:
            typer.secho(f"error: {e}", fg="red", err=True)
            raise typer.Exit(2) from e
        if as_json:
            typer.echo(json.dumps(doc.to_dict(), indent=2, ensure_ascii=False))
        else:
            typer.echo(f"{doc.title}\n{doc.url}  ({doc.doc_id}, {doc.source})\n\n{doc.text}")

