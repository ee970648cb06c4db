"""``python -m runq``: the same as the ``runq`` command."""

from runq.cli import main

if __name__ == "__main__":
    main()
