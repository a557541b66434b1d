"""``python -m capgate.cli``: the same as the ``capgate`` command."""

from capgate.cli import main

if __name__ == "__main__":
    main()
