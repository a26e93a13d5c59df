"""Fuzz the real ``drgym serve`` with schemathesis and write the counts as JSON.

    python scripts/fuzz_api.py --out scripts/results/fuzz_api.json

Serves the ``hotpotqa`` corpus (its index is built under ``$DRGYM_HOME`` when missing)
with the real CLI on a free loopback port, twice: without keys, then with ``--api-keys``
(schemathesis then also checks that a request without the key gets 401). Every
operation of ``/openapi.json`` (``/search``, ``/fineweb/search``, ``/fetch``,
``/retrieve``, ``/health``) gets schema-valid and schema-violating cases from every
schemathesis phase, and every answer is checked: no 5xx, status, body, content type and
headers as declared (see ``tests/fuzz_helpers.py``). A share of the cases
(``--non-finite-share``) is rewritten to hold ``NaN``, ``Infinity``, ``-Infinity``, ``1e400``
or ``-1e400`` (raw JSON text in a body field, nested or not, or a numeric query
parameter); each must get a 422 with a strict JSON body and leave the connection usable.
The defaults give about 5,000 cases. docs/reliability.md quotes ``cases``,
``non_finite_cases`` and ``server_errors`` from the JSON's ``total``.
``tests/test_server_fuzz.py`` runs a smaller version (slow-marked).

Exit status 1 when any answer is a 5xx, a check failed, schemathesis reported an error,
or no non-finite case was sent although the share is above 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="fuzz_api.json", help="JSON output file.")
    ap.add_argument("--max-examples", type=int, default=700, help="hypothesis examples per operation and phase, keyless run.")
    ap.add_argument("--max-examples-keys", type=int, default=500, help="the same for the run with --api-keys (0: skip it).")
    ap.add_argument("--non-finite-share", type=float, default=0.2,
                    help="share of cases rewritten to hold NaN/Infinity/1e400, 0..1 (default 0.2).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", default="hotpotqa", help="corpus to serve (default hotpotqa, 994 documents).")
    args = ap.parse_args()
    if not 0 <= args.non_finite_share <= 1:
        ap.error(f"--non-finite-share must be between 0 and 1, got {args.non_finite_share}")

    from drgym.atomic import atomic_write_json
    from drgym.search.local import LocalSearchEngine
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the fuzzing harness is a test helper
    from fuzz_helpers import fuzz_cli_server, summarize

    engine = LocalSearchEngine.from_corpus(args.corpus, method="hybrid")  # build once, outside the servers
    folder = str(engine.folder)
    engine.close()
    out: dict = {"command": " ".join(["python", "scripts/fuzz_api.py", *sys.argv[1:]]),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
                 "server": f"drgym serve --index-dir {folder} --cache-size 0 (uvicorn, own process, 127.0.0.1)"}
    cli = ["--index-dir", folder, "--cache-size", "0"]
    share = args.non_finite_share
    runs = [("no keys", fuzz_cli_server(cli, max_examples=args.max_examples, seed=args.seed, non_finite_share=share))]
    if args.max_examples_keys:
        runs.append(("--api-keys", fuzz_cli_server(cli, max_examples=args.max_examples_keys, seed=args.seed + 1,
                                                     api_key="fuzz-key-3c9e1a", non_finite_share=share)))
    out["runs"] = [{"auth": name, **r.to_dict()} for name, r in runs]
    out["total"] = summarize([r for _, r in runs])
    import schemathesis

    out["schemathesis"] = schemathesis.__version__
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(args.out, out)
    t = out["total"]
    print(f"{t['cases']} cases, {t['requests']} requests, {t['non_finite_cases']} with a non-finite number, "
          f"{t['server_errors']} answers of 5xx, {t['failures']} failed checks, {t['errors']} errors", file=sys.stderr)
    if share > 0 and t["non_finite_cases"] == 0:
        print("error: no request held a non-finite number although --non-finite-share > 0", file=sys.stderr)
    print(args.out)
    ok = t["server_errors"] == 0 and t["failures"] == 0 and t["errors"] == 0 and (share == 0 or t["non_finite_cases"] > 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
