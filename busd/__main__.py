"""``python -m busd``: the same as the ``busd`` command."""

from .cli import main

if __name__ == "__main__":
    main()
