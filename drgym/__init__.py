"""drgym: a reinforcement-learning gym for LLM search and deep-research agents.

Data flows one way: corpus -> index -> search backend -> environment -> reward ->
trainer / evaluator. ``import drgym`` is light: torch, faiss, sentence-transformers and
trl are imported only by the modules that need them.
"""

from drgym.types import Document, SearchResult

__version__ = "0.1.0"

__all__ = ["Document", "SearchResult", "__version__"]
