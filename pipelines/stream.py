"""The stream job as a script: ``python pipelines/stream.py --help``, the same as ``streameval stream --help``.
Its logic is :mod:`streameval.jobs.stream` (installed with the package); this folder is not."""
import sys

from streameval.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
