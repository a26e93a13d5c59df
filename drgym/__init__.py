"""drgym: a reinforcement-learning gym for LLM search and deep-research agents.

Data flows one way: corpus -> index -> search backend -> environment -> reward ->
trainer / evaluator. ``import drgym`` is light: torch, faiss, sentence-transformers and
trl are imported only by the modules that need them.

Importing drgym sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set already, so that idle
OpenMP threads of torch and faiss loaded afterwards sleep instead of spinning (see
:mod:`drgym.cpu`; thread counts follow the available cores, or ``$DRGYM_THREADS``).
"""

from drgym.cpu import ensure_wait_policy
from drgym.types import Document, SearchResult

ensure_wait_policy()

__version__ = "0.1.0"

__all__ = ["Document", "SearchResult", "__version__"]
