"""``python -m roundgate``: the same command line as the ``roundgate`` script."""

from roundgate.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
