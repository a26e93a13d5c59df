"""``python -m drgym`` runs the same CLI as the ``drgym`` console script."""

from drgym.cli import main

if __name__ == "__main__":
    main()
