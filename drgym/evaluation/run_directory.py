"""A rollout run directory and how a rerun resumes it: :class:`RunDirectory`.

A run directory holds:

- ``config.json``: everything needed to rerun (the :class:`RolloutConfig`, package
  versions, the thread settings (:func:`drgym.cpu.thread_record`), the index manifest
  fingerprint, the policy's resolved settings (with the dtype and why), seeds,
  the task ids);
- ``trajectories.jsonl``: one finished episode per line, appended atomically
  (:func:`drgym.atomic.append_jsonl`) as soon as the episode ends;
- ``metrics.json``: :func:`drgym.evaluation.metrics.compute_metrics` over the run's episodes;
- ``scores.png``, ``turns.png``, ``searches.png``: plots (:mod:`drgym.evaluation.plots`).

Rerunning the same command resumes: task ids with a complete episode in
``trajectories.jsonl`` are skipped, so an interrupted run (Ctrl-C, kill) loses only
unfinished episodes.

What keeps a run directory right:

- one writer: a run holds an ``fcntl.flock`` on ``run.lock`` (with its pid) from start
  to end, and removes the file when it ends (also on an error or Ctrl-C; a killed run
  leaves it, and the next run takes it over); a second run into the same directory
  stops with :class:`RunLockedError`;
- one task per id: each episode records its task's content hash
  (``metadata["task_sha256"]``: :func:`task_content_sha256` of the question, golds and
  every other field of the :class:`~drgym.records.Task`); a resume whose tasks differ
  from those of the episodes with their ids (a task file's lines reordered, a gold
  edited, another file of the same name) raises :class:`TasksChangedError` naming them,
  and so does a run directory whose episodes record no hash (written by an older drgym);
- one engine: ``config.json`` records the search engine's identity (``engine``:
  :meth:`drgym.search.base.SearchBackend.identity`, e.g. the index fingerprint and
  method, or what a server's ``/health`` reports); resuming against another engine
  raises :class:`EngineChangedError` unless ``allow_engine_change`` (then
  ``engine_changes`` records both);
- failed is not done: an episode with a backend or policy failure (a search answered
  HTTP 401, a model request refused with HTTP 404:
  :func:`drgym.evaluation.metrics.episode_failures`) is recorded with its errors (and
  ``metadata["failed"]``), counted in ``metrics.json``'s ``failed``, and run again by the
  next run (the record kept for a task is its first complete one, else its last one);
- damaged lines: on resume every line of ``trajectories.jsonl`` is checked against the
  episode schema (:func:`drgym.records.trajectory_record_error`); lines that are not
  UTF-8, not JSON objects, not whole records, or hold a number that is not finite or
  out of range (a ``NaN`` or ``1e308`` reward, a negative count) are moved to
  ``trajectories.rejected.jsonl`` with one warning and their episodes run again; an
  episode whose record would fail that check is not written
  (:class:`InvalidEpisodeError`);
- a full disk: an episode line is appended in one write and the file truncated back on
  failure, so no partial line is left; :class:`RunDiskFullError` names the file and the
  full directory.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from drgym.atomic import DiskFullError, append_jsonl, atomic_write_bytes, atomic_write_json
from drgym.errors import ConfigError, DrgymError
from drgym.evaluation.metrics import episode_failures
from drgym.evaluation.run_config import RolloutConfig
from drgym.records import trajectory_record_error
from drgym.redact import redact

# the runner's logger, named as before the split into run_config / run_directory / rollout_loop
log = logging.getLogger("drgym.evaluation.runner")


class EngineChangedError(ConfigError):
    """A run directory is being resumed against a different search engine than the one
    its finished episodes searched (another index, method, encoder, collapse mode, max_k
    or provider: :meth:`drgym.search.base.SearchBackend.identity`). Resuming would mix
    two engines' results in one run; ``allow_engine_change=True``
    (``--allow-engine-change``) resumes anyway and records both identities."""


class TasksChangedError(ConfigError):
    """A run directory is being resumed over tasks whose content differs from that of the
    episodes recorded under their ids (the question, the golds or another field of the
    :class:`~drgym.records.Task`: :func:`task_content_sha256`), or whose episodes record no
    task content at all (written by an older drgym). Resuming would keep episodes of other
    questions, or score them against old golds; the message names the tasks.

    Attributes:
        task_ids: the task ids whose recorded content differs from (or is missing for) the
            task now given, in task order.
    """

    def __init__(self, message: str, task_ids: list[str]) -> None:
        super().__init__(message)
        self.task_ids = task_ids


class InvalidEpisodeError(DrgymError, ValueError):
    """A finished episode's record fails the run file's own check
    (:func:`drgym.records.trajectory_record_error`: e.g. a reward that returned ``NaN``),
    so it is not written: a resume would refuse the line. The message names the episode,
    its task and the field."""


class RunLockedError(DrgymError):
    """Another process is writing the same run directory (it holds ``run.lock``).

    Attributes:
        pid: that process's id, or None when the lock file does not say.
    """

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class RunDiskFullError(DrgymError, OSError):
    """The disk holding the run directory filled up while an episode was being written:
    the message names the file and the directory; the file is as it was before the write
    (no partial line), and rerunning the same command once there is room resumes."""

    def __init__(self, cause: DiskFullError, note: str) -> None:
        super().__init__(cause.errno, cause.strerror, cause.filename)
        self.message = f"{cause} {note}"

    def __str__(self) -> str:
        return self.message


LOCK_FILE = "run.lock"
"""The lock file of a run directory: ``fcntl.flock``-ed by the one process writing the
run (:class:`RunDirectory`), holding that process's pid; removed when the run ends."""

REJECTED_FILE = "trajectories.rejected.jsonl"
"""Where damaged lines of ``trajectories.jsonl`` are moved on resume: one JSON object per
line, ``{"line", "reason", "raw", "moved_at"}`` (``raw``: the line as text; bytes that
are not UTF-8 appear as ``\\xNN`` escapes)."""

RESOLVED_POLICY_KEYS = ("layout", "scaffold", "dtype", "weights")
"""Policy settings resolved at build time (``auto`` values, and ``weights``: the content
fingerprint of the model behind a path, :func:`drgym.models.weights_revision`), checked
when a run resumes; ``weights`` also inside a wrapping policy's record (the ``rtr:``
agent, the ``rag:`` reader)."""


def resolved_policy_settings(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The :data:`RESOLVED_POLICY_KEYS` of a policy record and of the policy records nested
    in it, by dotted path (``"weights"``, ``"agent.weights"``)."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        if isinstance(v, dict):
            out.update(resolved_policy_settings(v, f"{prefix}{k}."))
        elif k in RESOLVED_POLICY_KEYS:
            out[prefix + k] = v
    return out


# -- what config.json records -----------------------------------------------------------
def versions() -> dict[str, str]:
    """Versions of Python, drgym and the libraries that shape results."""

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("drgym", "torch", "transformers", "gymnasium", "faiss-cpu", "bm25s", "sentence-transformers", "vllm", "trl"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    out["cpu_count"] = str(os.cpu_count())
    return out


def backend_fingerprint(backend: Any) -> dict[str, Any]:
    """Identity of the backend for the run config: name, method and index manifest."""
    d: dict[str, Any] = {"name": getattr(backend, "name", type(backend).__name__), "class": type(backend).__name__,
                         "deterministic": getattr(backend, "deterministic", None)}
    if hasattr(backend, "method"):
        d["method"] = backend.method
    m = getattr(backend, "manifest", None)
    if m is not None:
        ident = m.identity() if hasattr(m, "identity") else {}
        d["index"] = {"name": getattr(m, "name", None), "corpus": getattr(m, "corpus", None),
                      "corpus_fingerprint": getattr(m, "corpus_fingerprint", None),
                      "n_passages": getattr(m, "n_passages", None), "encoder": getattr(m, "encoder", None),
                      "encoder_revision": getattr(m, "encoder_revision", None), "factory": getattr(m, "factory", None),
                      "manifest_fingerprint": hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]}
    return d


def engine_identity(backend: Any) -> dict[str, Any]:
    """The search engine a run is bound to: ``backend.identity()``
    (:meth:`drgym.search.base.SearchBackend.identity`; name and class for an object
    without one), as plain JSON with secrets redacted.

    Raises:
        ServiceUnavailableError: a remote backend's server cannot be reached.
    """

    fn = getattr(backend, "identity", None)
    ident = fn() if callable(fn) else {"kind": "other", "name": getattr(backend, "name", type(backend).__name__),
                                       "class": type(backend).__name__}
    return json.loads(json.dumps(redact(ident), sort_keys=True, default=str))


def task_content_sha256(task: Any) -> str:
    """The content hash that binds an episode to its task: SHA-256 (64 hex digits) of
    the task's :meth:`~drgym.records.Task.to_dict` (id, question, golds, kind, gold
    documents, key points, source and metadata) as canonical JSON (sorted keys, no
    spaces, UTF-8; a set is written as its sorted items, another value JSON cannot hold
    as its ``str``), so the hash is the same in every process.

    >>> from drgym.records import Task
    >>> a = task_content_sha256(Task(task_id="t-0", question="Capital of France?", answers=["Paris"]))
    >>> len(a), a == task_content_sha256(Task(task_id="t-0", question="Capital of France?", answers=["Lyon"]))
    (64, False)
    """
    data = task.to_dict() if hasattr(task, "to_dict") else task
    def plain(v: Any) -> Any:  # a set's order depends on the process's hash seed
        return sorted(v, key=repr) if isinstance(v, (set, frozenset)) else str(v)

    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=plain)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _listed(ids: list[str], most: int = 5) -> str:
    """``"a, b, c"``, or the first ``most`` and how many more."""
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")


# -- the run directory -------------------------------------------------------------------
class RunDirectory:
    """A rollout run directory: ``config.json``, ``trajectories.jsonl``, ``metrics.json``.

    One process writes a run directory at a time: the constructor takes an exclusive
    ``fcntl.flock`` on :data:`LOCK_FILE` (holding this process's pid) and :meth:`close`
    removes the file and releases it; a second writer gets :class:`RunLockedError`
    naming the first one's pid. The file is removed while it is still locked, and a
    writer that locked a file no longer at the path (removed by a run that ended in
    between) lets it go and tries again, so two writers never hold the directory.

    ``config.json`` is read once (:attr:`previous`) and written by :meth:`write_config`;
    episodes are appended to ``trajectories.jsonl`` one whole line at a time. When the
    directory is opened, every line of ``trajectories.jsonl`` is checked against the
    episode schema (:func:`drgym.records.trajectory_record_error`): lines that are not
    UTF-8, not JSON, not an object or not a whole episode record are moved to
    :data:`REJECTED_FILE` (one warning), so their episodes are run again.

    Args:
        out: the folder (created here, for the lock).
        fresh: discard an earlier run there (its trajectories, rejected lines, config, metrics and answers.md).

    Raises:
        RunLockedError: another process holds the run directory.
    """

    def __init__(self, out: Path, *, fresh: bool = False) -> None:
        self.out = Path(out)
        self.trajectories = self.out / "trajectories.jsonl"
        self.config = self.out / "config.json"
        self.metrics = self.out / "metrics.json"
        self.rejected_path = self.out / REJECTED_FILE
        self.lock_path = self.out / LOCK_FILE
        self._lock_fd: int | None = None
        self._opened_records: list[dict[str, Any]] = []
        self._task_hashes: dict[str, str] = {}
        self._acquire()
        try:
            if fresh:
                # answers.md (drgym.evaluation.answers) is made from trajectories.jsonl: it goes with it
                for p in (self.trajectories, self.config, self.metrics, self.rejected_path, self.out / "answers.md"):
                    if p.exists():
                        p.unlink()
            self.previous: dict[str, Any] | None = None
            if self.config.exists():
                try:
                    prev = json.loads(self.config.read_text(encoding="utf-8"))
                    if not isinstance(prev, dict):
                        raise ValueError(f"not a JSON object ({type(prev).__name__})")
                    self.previous = prev
                except (OSError, ValueError) as e:
                    log.warning("%s is unreadable (%s); it will be rewritten", self.config, e)
            self.rejected = self._check_trajectories()
        except BaseException:
            self.close()
            raise

    # -- one writer ----------------------------------------------------------------------
    def _acquire(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                try:
                    text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
                finally:
                    os.close(fd)
                pid = int(text) if text.isdigit() else None
                who = f"process {pid}" if pid is not None else "another process (its pid is not written yet)"
                raise RunLockedError(
                    f"{self.out} is being written by {who} (it holds {self.lock_path}); wait for that run to end, "
                    "stop it, or use another --out.", pid) from None
            # a run that ended between our open and our lock removed the file: this lock
            # guards nothing (a third run may hold a new file there), so take the path's file
            try:
                now = os.stat(self.lock_path)
            except FileNotFoundError:
                now = None
            held = os.fstat(fd)
            if now is not None and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
                break
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        """Remove the lock file and release the run directory's lock (idempotent).

        The file is removed while the lock is held, so no other run can take it in
        between (:meth:`_acquire` checks that the file it locked is still the path's).
        """
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            try:
                try:
                    self.lock_path.unlink()
                except FileNotFoundError:
                    log.warning("%s was removed while this run held it", self.lock_path)
            finally:
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    os.close(fd)

    def __enter__(self) -> "RunDirectory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------
    def _scan(self) -> tuple[list[dict[str, Any]], list[bytes], list[dict[str, Any]], bool]:
        """``(records, raw_lines, rejected, clean)`` of ``trajectories.jsonl``: the valid
        episode records in file order and their lines as written (newline included), the
        rejected lines (``{"line", "reason", "raw"}``), and whether the file needs no
        rewrite (every line valid and newline-terminated, no blank line)."""

        records: list[dict[str, Any]] = []
        raw_lines: list[bytes] = []
        rejected: list[dict[str, Any]] = []
        if not self.trajectories.exists():
            return records, raw_lines, rejected, True
        data = self.trajectories.read_bytes()
        pieces = data.split(b"\n")
        clean = pieces[-1] == b""  # ends with a newline (or is empty)
        if clean:
            pieces.pop()
        for n, raw in enumerate(pieces, 1):
            if not raw.strip():
                clean = False  # a blank line is dropped on a rewrite
                continue
            rec: Any = None
            try:
                rec = json.loads(raw.decode("utf-8"))
                why = trajectory_record_error(rec)
            except UnicodeDecodeError as e:
                why = f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
            except json.JSONDecodeError as e:
                why = f"not valid JSON ({e.msg}, column {e.colno})"
            except RecursionError:
                why = "not valid JSON (nested too deeply)"
            except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
                why = f"not valid JSON ({e})"
            if why is None:
                records.append(rec)
                raw_lines.append(raw + b"\n")
            else:
                rejected.append({"line": n, "reason": why, "raw": raw.rstrip(b"\r").decode("utf-8", "backslashreplace")})
        return records, raw_lines, rejected, clean and not rejected

    def _check_trajectories(self) -> int:
        """Move damaged lines of ``trajectories.jsonl`` to :data:`REJECTED_FILE` (appended
        there first, then the main file is rewritten atomically with its valid lines, byte
        for byte); returns how many were moved."""
        records, raw_lines, rejected, clean = self._scan()
        self._opened_records = records
        if clean:
            return 0
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for r in rejected:
            append_jsonl(self.rejected_path, {**r, "moved_at": now})
        atomic_write_bytes(self.trajectories, b"".join(raw_lines))
        if rejected:
            first = rejected[0]
            log.warning("%s: %d line(s) are not whole episode records (line %d: %s%s); moved to %s, their episodes "
                        "will be run again.", self.trajectories, len(rejected), first["line"], first["reason"],
                        "; ..." if len(rejected) > 1 else "", self.rejected_path)
        return len(rejected)

    def records(self) -> list[dict[str, Any]]:
        """Every valid episode record of ``trajectories.jsonl``, in file order."""
        return self._scan()[0]

    def check_identity(self, config: RolloutConfig) -> None:
        """Raise :class:`ConfigError` when the directory holds a different run."""
        if self.previous is None:
            return
        old = self.previous.get("identity") or {}
        now = json.loads(json.dumps(config.identity()))
        if self.previous.get("identity") != now:
            diff = sorted(k for k in set(old) | set(now) if old.get(k) != now.get(k))
            raise ConfigError(
                f"{self.out} holds a different run (differs in: {', '.join(diff)}). Use another --out, or --fresh to discard it."
            )

    def bind_tasks(self, tasks: list[Any]) -> None:
        """Bind the run to its tasks' content: check that every episode recorded under one
        of their ids answered the same task, and stamp each episode appended from now on
        with its task's :func:`task_content_sha256` (``metadata["task_sha256"]``).

        Episodes of task ids not among ``tasks`` (a larger ``n`` before) are not checked
        now (they are not in the run's metrics); the run that takes them in again checks
        them. Failed episodes are checked too (their record is reported until redone).

        Args:
            tasks: the run's :class:`~drgym.records.Task` objects.

        Raises:
            TasksChangedError: an episode recorded under a task id holds another task's
                content hash, or none (written by an older drgym); the message names the
                tasks (the first five, and how many in all).
        """
        self._task_hashes = {t.task_id: task_content_sha256(t) for t in tasks}
        order = {tid: i for i, tid in enumerate(self._task_hashes)}
        changed: set[str] = set()
        unhashed: set[str] = set()
        for d in self._opened_records:
            tid = d["task_id"]
            if tid not in self._task_hashes:
                continue
            got = (d.get("metadata") or {}).get("task_sha256")
            if got is None:
                unhashed.add(tid)
            elif got != self._task_hashes[tid]:
                changed.add(tid)
        if changed:
            ids = sorted(changed, key=order.__getitem__)
            raise TasksChangedError(
                f"{self.out} holds episodes of {len(ids)} task(s) whose question, golds or other fields have changed "
                f"since they ran ({_listed(ids)}): the task file was edited, reordered or replaced (a plain JSONL "
                "file's task ids are its line numbers). Resuming would keep answers to other questions or score "
                "them against old golds. Use --fresh or another --out.", ids)
        if unhashed:
            ids = sorted(unhashed, key=order.__getitem__)
            raise TasksChangedError(
                f"{self.out} holds episodes that record no task content hash ({len(ids)} task(s): {_listed(ids)}); "
                "they were written by an older drgym, so it cannot be checked that they answered these questions "
                "with these golds. Use --fresh or another --out to run them again.", ids)

    def done_task_ids(self) -> set[str]:
        """Task ids with a complete episode in ``trajectories.jsonl`` when the directory was
        opened (an episode with a backend or policy failure,
        :func:`drgym.evaluation.metrics.episode_failures`, is not complete: it is run again)."""

        return {d["task_id"] for d in self._opened_records if not episode_failures(d)}

    def check_engine(self, engine: dict[str, Any], *, allow_change: bool) -> dict[str, Any] | None:
        """Check that a resumed run searches the engine its episodes searched.

        Args:
            engine: this session's :func:`engine_identity`.
            allow_change: resume against a different engine anyway.

        Returns:
            None when the engine is the earlier session's (or none was recorded); the
            change ``{"from", "to", "at"}`` when it differs and ``allow_change``.

        Raises:
            EngineChangedError: it differs and not ``allow_change`` (the message names
                the differing fields, old and new).
        """
        old = (self.previous or {}).get("engine")
        if not isinstance(old, dict):
            if self.previous is not None:
                log.warning("%s records no search engine identity (written by an older drgym, or the server was "
                            "down when the run started): cannot check that the resumed episodes search the same "
                            "engine; this session's is recorded.", self.config)
            return None
        if old == engine:
            return None
        def flat(d: dict[str, Any]) -> dict[str, Any]:  # a served engine's identity nests: "engine.method"
            return {f"{k}.{j}" if isinstance(v, dict) else k: w
                    for k, v in d.items() for j, w in (v.items() if isinstance(v, dict) else [(None, v)])}

        old_f, new_f = flat(old), flat(engine)
        diff = sorted(k for k in set(old_f) | set(new_f) if old_f.get(k) != new_f.get(k))
        if len(diff) > 1 and "index_repr" in diff:  # the whole /health line repeats the parsed fields
            diff.remove("index_repr")
        shown = "; ".join(f"{k}: {old_f.get(k)!r} -> {new_f.get(k)!r}" for k in diff)
        if not allow_change:
            raise EngineChangedError(
                f"{self.out} was run against another search engine ({shown}); resuming would mix two engines' "
                "results. Serve the same engine, use --fresh or another --out, or pass --allow-engine-change to "
                "resume anyway (both engines are recorded in config.json).")
        log.warning("%s: resuming against another search engine (%s), as --allow-engine-change asks.", self.out, shown)
        return {"from": old, "to": engine, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def changed_policy_settings(self, policy_record: dict[str, Any]) -> list[str]:
        """Settings a policy resolves itself (:data:`RESOLVED_POLICY_KEYS`) that differ from the earlier session's."""
        prev = resolved_policy_settings((self.previous or {}).get("policy") or {})
        now = resolved_policy_settings(policy_record)
        return [k for k in prev if prev[k] != now.get(k)]

    def write_config(self, record: dict[str, Any], session: dict[str, Any]) -> None:
        """Write ``config.json``: ``record``, keeping the first session's ``created``, every
        session and every recorded engine change (``engine_changes``)."""
        if self.previous is not None:
            record["created"] = self.previous.get("created", record.get("created"))
            record["sessions"] = list(self.previous.get("sessions", []))
            changes = list(self.previous.get("engine_changes") or [])
            if changes or record.get("engine_changes"):
                record["engine_changes"] = changes + list(record.get("engine_changes") or [])
        record.setdefault("sessions", []).append(session)
        atomic_write_json(self.config, record)
        self.previous = record

    def append(self, traj: Any) -> list[str]:
        """Append one finished episode (a whole line, atomically); an episode with a
        backend or policy failure gets ``metadata["failed"]`` (its reasons).

        When the run is bound to its tasks (:meth:`bind_tasks`), the episode gets its
        task's content hash (``metadata["task_sha256"]``).

        Returns:
            The episode's failures (:func:`drgym.evaluation.metrics.episode_failures`; empty: complete).

        Raises:
            InvalidEpisodeError: the record fails :func:`drgym.records.trajectory_record_error`
                (a reward of ``NaN``...): nothing is written.
            RunDiskFullError: the disk is full (nothing of the line was written).
        """

        if traj.task_id in self._task_hashes:
            traj.metadata["task_sha256"] = self._task_hashes[traj.task_id]
        d = traj.to_dict()
        failures = episode_failures(d)
        if failures:
            d["metadata"]["failed"] = failures
            traj.metadata["failed"] = failures
        why = trajectory_record_error(json.loads(json.dumps(d)))  # as the line will read back
        if why is not None:
            raise InvalidEpisodeError(
                f"episode {traj.episode_id} (task {traj.task_id}) was not written to {self.trajectories}: its record "
                f"is not valid ({why}); a resume would refuse it. The reward or policy that produced it is at fault.")
        try:
            append_jsonl(self.trajectories, d)
        except DiskFullError as e:
            raise RunDiskFullError(e, "The episodes finished before are saved; rerun the same command to resume.") from e
        return failures

    def episodes(self, index_of: dict[str, int]) -> list[dict[str, Any]]:
        """The run's episodes among the selected tasks, one per task id, in task order: the
        first complete record of the task, else its last (failed) record."""
        chosen = select_episodes(self.records())
        return sorted((d for tid, d in chosen.items() if tid in index_of), key=lambda d: index_of[d["task_id"]])


def select_episodes(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One record per task id of a run's valid records (file order): the first complete
    one, else the last failed one (:func:`drgym.evaluation.metrics.episode_failures`; a
    failed episode is redone and appended by the next run).

    Returns:
        ``{task_id: record}`` in the order task ids first appear.
    """

    chosen: dict[str, dict[str, Any]] = {}
    complete: set[str] = set()
    for d in records:
        tid = d["task_id"]
        if tid in complete:
            continue
        chosen[tid] = d
        if not episode_failures(d):
            complete.add(tid)
    return chosen


def read_run_episodes(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The episodes of a run's ``trajectories.jsonl`` for a reader that does not write the
    run (``drgym report``): lines that are not UTF-8 JSON objects with a string
    ``task_id``, or whose fields are not valid (:func:`drgym.records.trajectory_record_error`
    with ``partial=True``: a field may be missing, but one present must have its type,
    and its numbers must be finite and in range) are skipped with one warning (not moved:
    only a resuming run moves them), then one record per task id as
    :func:`select_episodes` picks it, in the order task ids first appear.

    Raises:
        FileNotFoundError: no file at ``path``.
    """

    records = []
    skipped: list[tuple[int, str]] = []
    for n, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw.decode("utf-8"))
            why = trajectory_record_error(d, partial=True)
            if why is None and not isinstance(d.get("task_id"), str):
                why = "task_id: Input should be a valid string"
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, a huge integer
            why = f"not valid JSON or not UTF-8 ({type(e).__name__})"
        if why is None:
            records.append(d)
        else:
            skipped.append((n, why))
    if skipped:
        log.warning("%s: %d line(s) are not whole episode records and are left out (line %d: %s%s).", path,
                    len(skipped), skipped[0][0], skipped[0][1], "; ..." if len(skipped) > 1 else "")
    return list(select_episodes(records).values())
